"""Helpers the tests share: polling (``helpers``), worker processes (``workers``), servers a
test can stop (``servers``), the reference model (``model``), store peeks (``peek``), lodash
(``lodash``), process tools (``procs``) and test-process-only tasks (``private_tasks``)."""
