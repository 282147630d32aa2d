"""Database connections of the worker's own threads (the pump, the lease keeper), and the
fork guard of SQLite projects (docs/design.md, "Dispatch at scale", "Connections")."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import close_old_connections, connections

logger = logging.getLogger("django_debounce")

REFRESH = 60.0  # seconds between Django's age rule in a worker thread
FORK_WAIT = 30.0  # seconds a fork waits for the ticks in progress before it goes ahead

_last = threading.local()


class _ForkGuard:
    """Ticks in progress hold it; a fork of this process waits until none does, and no tick
    starts from the moment a fork waits until it is done (a reader-writer lock whose writer,
    ``fork()``, goes first: back-to-back ticks never starve it). A long tick (a pump batch
    loop) asks ``fork_pending()`` between batches and ends early."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self, keep: dict[int, int] | None = None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holders: dict[int, int] = dict(keep or {})  # thread ident -> nested holds
        self._forks = 0  # forks waiting or under way (two threads may fork at once)

    @contextmanager
    def holding(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if me not in self._holders:  # a nested hold never waits (the fork waits for it)
                self._cond.wait_for(lambda: not self._forks)
            self._holders[me] = self._holders.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                left = self._holders.pop(me, 1) - 1
                if left:
                    self._holders[me] = left
                else:
                    self._cond.notify_all()

    def before_fork(self) -> None:
        # In the forking thread. A tick of the forking thread itself is not waited for.
        me = threading.get_ident()
        with self._cond:
            self._forks += 1
            if not self._cond.wait_for(lambda: set(self._holders) <= {me}, timeout=FORK_WAIT):
                logger.warning(
                    "django_debounce: forking while a worker thread still uses SQLite after %.0f s",
                    FORK_WAIT,
                )

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forks -= 1
            self._cond.notify_all()

    def after_fork_in_child(self) -> None:
        # The child has none of the parent's threads but the forking one, and a lock of its own.
        me = threading.get_ident()
        self._reset({me: self._holders[me]} if me in self._holders else None)


_fork_guard = _ForkGuard()
os.register_at_fork(
    before=_fork_guard.before_fork,
    after_in_parent=_fork_guard.after_fork_in_parent,
    after_in_child=_fork_guard.after_fork_in_child,
)


def fork_pending() -> bool:
    """Whether a fork of this process waits for the ticks in progress (SQLite projects): a
    tick that loops over batches ends after the current one, and the next starts after the
    fork."""
    return _fork_guard._forks > 0


def _uses_sqlite() -> bool:
    return any(connections[alias].vendor == "sqlite" for alias in connections)


@contextmanager
def thread_tick() -> Iterator[None]:
    """One tick of a worker thread (the pump, the lease keeper):
    ``tidy_thread_connections()`` first; on a project with an SQLite database the tick also
    holds the fork guard and closes this thread's SQLite connections when it ends (see the
    module's docstring)."""
    tidy_thread_connections()
    if not _uses_sqlite():
        yield
        return
    with _fork_guard.holding():
        try:
            yield
        finally:
            for conn in connections.all(initialized_only=True):
                if conn.vendor == "sqlite" and conn.connection is not None:
                    try:
                        conn.close()
                    except Exception:  # the others are closed all the same
                        logger.exception("django_debounce: closing %s failed", conn.alias)


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
