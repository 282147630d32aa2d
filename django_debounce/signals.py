"""Django signals sent by django-debounce, for monitoring and auditing (docs/design.md,
"Models, admin, commands and signals").

The ``sender`` is the debounced task; every argument is a keyword (accept ``**kwargs``).
Signals are sent with ``send_robust``: a receiver that raises is logged and never breaks a
trigger or a run. Connecting one: docs/guide/integration.md, "Signals".

``trigger_received`` is sent in the process that triggers (web, shell), after the trigger is
counted (for a trigger made inside a transaction: after the commit):

- ``task_name`` (str): Celery name of the task.
- ``key`` (str): the readable key.
- ``flight_id`` (int): the flight the trigger joined.
- ``pending`` (int): triggers now pending in that flight, this one included.
- ``due_at`` (datetime): when the flight may run (aware, UTC).
- ``scheduled`` (bool): this trigger published its flight's dispatch message at once
  (``False``: merged, the flight waits in the due index, or the broker refused the message;
  ``pending == 1``: it opened the flight).

``run_started`` is sent in the worker when a flight has been claimed, before the body runs;
``run_finished`` after the body returned or raised and the run was recorded. Both pass:

- ``task_name`` (str), ``key`` (str), ``flight_id`` (int), ``run_id`` (int);
- ``triggers`` (int): triggers claimed by the run;
- ``merged`` (int): ``triggers - 1``, the triggers absorbed without a run of their own;
- ``delay`` (float): seconds from the last claimed trigger to the start of the run;
- ``started_at`` (datetime): when the run was claimed (aware, UTC, the store's clock);
- ``attempt`` (int): retries made before this run (0: the first try).

``run_finished`` adds:

- ``outcome`` (str): ``"success"``; ``"retry"`` (the body raised and the claimed triggers
  went back to pending for a retry, after the task's Celery backoff); or ``"failure"`` (the
  body raised and no retry is left);
- ``error`` (str): the exception's text for ``"retry"`` and ``"failure"``, ``""`` on success;
- ``duration`` (float): seconds the body ran (this process's monotonic clock).
"""

from __future__ import annotations

from django.dispatch import Signal

trigger_received = Signal()
run_started = Signal()
run_finished = Signal()

__all__ = ["trigger_received", "run_started", "run_finished"]
