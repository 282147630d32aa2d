"""Database connections of the worker's own threads (the pump, the lease keeper, the recorder).

Django closes a request's connection at its end, and Celery closes a task's around it, by
``close_old_connections()``: with ``CONN_MAX_AGE = 0`` (Django's default) that closes every
connection. A thread that ticks every second and called it each tick opened a new database
session per tick (~1 session/s per idle worker, ``bench/results/scale.md``). These threads
keep their connections instead: an unusable one (after an error) is closed at once, and
Django's own age rule (``close_old_connections``) is applied only every ``REFRESH`` seconds,
so a restarted database server or a changed setting is still picked up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.db import close_old_connections, connections

REFRESH = 60.0  # seconds between Django's age rule in a worker thread

_last = threading.local()


def tidy_thread_connections(now: float | None = None) -> None:
    """Before a tick of a worker thread: close this thread's connections that failed and are
    no longer usable, and apply ``close_old_connections()`` once every ``REFRESH`` seconds
    (``now`` is ``time.monotonic()``, given by tests)."""
    now = time.monotonic() if now is None else now
    if now - getattr(_last, "at", float("-inf")) >= REFRESH:
        _last.at = now
        close_old_connections()
        return
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred and not conn.is_usable():
            conn.close()


def closing(run: Callable[[], None]) -> Callable[[], None]:
    """``run``, then close the connections it opened in its thread (a thread's connections
    are its own; Django never closes those of a thread that ends). For ``Thread(target=...)``
    of the worker's threads; ``run`` itself leaves the caller's connections open."""

    def target() -> None:
        try:
            run()
        finally:
            connections.close_all()

    return target
