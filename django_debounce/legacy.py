"""The previous release's dispatch messages and Redis layout, after an upgrade (docs/operations.md,
"Upgrading from 0.1").

Release 0.1 published one countdown message per pending flight (``{"k", "s", "b"}``) and a
lease watchdog message per live run (``{"k", "w", "b"}``), and kept a key's Redis state in one
hash ``debounce:{<key hash>}``. After an upgrade such messages may still be in the broker,
and, during a rolling deploy, workers and web processes of 0.1 still run beside this one.

- A 0.1 message of the database store names a row this release keeps using: it is handled as
  a dispatch message of this release (the same fencing sequence). Its watchdogs are dropped:
  the data migration put every live row in the due index, which watches its lease.
- A 0.1 message of the Redis store makes this release adopt the key's 0.1 flight into its own
  layout and due index (``adopt.lua``), leaving a tombstone in the 0.1 hash: 0.1 workers then
  drop every message of that flight, and a 0.1 web process that triggers the key again opens a
  new 0.1 flight, whose message is adopted in turn. A 0.1 run still live is left to its worker
  (which publishes its follow-up as 0.1 did); the flight is adopted after it.
- A 0.1 flight whose messages were lost is found through its durable record (the data
  migration asked for a recheck of every live one).

Nothing is lost or run twice. A run of a 0.1 worker and a run of this release may overlap for
one key only while both kinds of worker run, and only when that key is triggered from both
kinds of web process.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("django_debounce")


def redis_store_of(task: Any) -> Any:
    """The Redis store ``task`` uses (itself, or the ``auto`` store's), or ``None``."""
    from django_debounce.backends.redis import RedisBackend

    backend = task.get_backend()
    if isinstance(backend, RedisBackend):
        return backend
    redis = getattr(backend, "redis", None)
    return redis if isinstance(redis, RedisBackend) else None


def handle(task: Any, message: Any) -> Any:
    """Handle a 0.1 dispatch message (``message``: a parsed ``dispatch.Message``) of ``task``."""
    if message.store != "r":
        if message.watch:
            return None  # the due index watches every live row's lease (migration 0005)
        return task.fire(message.key_hash, message.seq, store="d")
    store = redis_store_of(task)
    if store is None or store.cluster:
        logger.warning(
            "django_debounce: a 0.1 message of the Redis store for %s was dropped: no Redis "
            "store holds this task's keys now",
            task.name,
        )
        return None
    adopted = store.adopt(message.key_hash, task.name, task.flight_options())
    if adopted < 0:
        logger.info(
            "django_debounce: %s key %s: a 0.1 run is live; its flight is adopted after it",
            task.name,
            message.key_hash[:12],
        )
    return None
