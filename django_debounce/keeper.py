"""The lease keeper: keeps the leases of a worker's live runs alive from its main process
(docs/design.md, "Leases").

A run holds a lease in the store; past it the run counts as lost and is redone (I7). One
keeper per worker, in the main process, extends the leases of all the runs its pool is
executing, each every third of its lease, in one batch per store; it looks at the active runs
at least every ``LOOK`` seconds (no store call), so a run that starts while another's long
lease needs nothing is seen at once. A body that holds the GIL in C code or never yields
cannot starve it (it lives in another process under prefork), and no thread is started per
run. A run is known by its dispatch message (key hash and sequence),
which the main process holds for every request it has handed to the pool.

When the store cannot be reached, the keeper stops a run before its lease ends (minus a
margin) by terminating the pool process that runs it (prefork), so the run that redoes it
never overlaps it (I2). Pools that cannot terminate one task (threads, gevent, eventlet,
solo) are warned about at worker start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django_debounce.backends.base import LiveRun
from django_debounce.dispatch import DISPATCH_KWARG, parse_message

logger = logging.getLogger("django_debounce")

# Seconds before a lease ends by which a run whose lease could not be renewed is stopped.
MARGIN = 2.0
# Longest sleep between two looks at the active runs (a look costs no store call): a run that
# starts while the keeper waits to extend a long lease is seen this soon, whatever its lease.
LOOK = 0.5


@dataclass
class _Tracked:
    deadline: float  # wall-clock time until which the lease is known to hold
    lease: float
    claimed: bool = False
    extend_at: float = 0.0  # when its lease is extended next (0: at the next look)


class LeaseKeeper:
    """Extends the leases of the live debounced runs of one worker (``pool``: the worker's
    pool, used to terminate a run whose lease cannot be renewed)."""

    def __init__(self, pool: Any = None) -> None:
        self.pool = pool
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.tracked: dict[str, _Tracked] = {}
        self.extended = 0
        self.terminated = 0

    def live(self) -> list[tuple[Any, Any, Any]]:
        """``(request, task, message)`` of every active request that is a debounced run."""
        from celery.worker import state

        from django_debounce.tasks import DebouncedTask

        out = []
        for request in list(state.active_requests):
            task = getattr(request, "task", None)
            if not isinstance(task, DebouncedTask):
                continue
            try:
                kwargs = request.kwargs or {}
            except Exception:
                continue
            message = parse_message(kwargs.get(DISPATCH_KWARG))
            if message is None or message.legacy:
                continue
            out.append((request, task, message))
        return out

    def tick(self) -> float:
        """Extend the lease of every live run that is due for it (a run new to the keeper at
        once, then every third of its lease); stop runs whose lease could not be renewed in
        time. Returns the seconds until the next tick (at most ``LOOK``)."""
        runs = self.live()
        now = time.time()
        seen = {}
        by_store: dict[Any, list[tuple[Any, Any, Any, LiveRun]]] = defaultdict(list)
        for request, task, message in runs:
            options = task.flight_options()
            tracked = self.tracked.get(request.id)
            if tracked is None:
                # claimed after the request started: its lease ends no earlier than this
                start = request.time_start or now
                tracked = self.tracked[request.id] = _Tracked(start + options.lease, options.lease)
            seen[request.id] = (request, task, tracked)
            if now < tracked.extend_at:
                continue
            run = LiveRun(
                message.key_hash,
                message.seq,
                options.lease,
                task.name,
                options,
                message.store or "",
            )
            by_store[task.get_backend()].append((request, task, message, run))
        for request_id in list(self.tracked):
            if request_id not in seen:
                del self.tracked[request_id]
        for backend, items in by_store.items():
            try:
                ends = backend.extend([item[3] for item in items])
            except Exception as exc:
                logger.warning("django_debounce: could not extend leases (%s)", exc)
                ends = [None] * len(items)
                failed = True
            else:
                failed = False
            for (request, _task, _message, _run), end in zip(items, ends, strict=True):
                tracked = self.tracked[request.id]
                # every run's lease is extended at least three times per lease
                tracked.extend_at = now + tracked.lease / 3.0
                if end is not None:
                    tracked.deadline = now + end
                    tracked.claimed = True
                    self.extended += 1
                elif tracked.claimed and not failed:
                    # the store says the run is not live: it finished (the request leaves the
                    # active set in a moment) or its lease was lost; the deadline decides
                    pass
        for request, task, tracked in seen.values():
            if now >= tracked.deadline - min(MARGIN, tracked.lease / 4):
                self._stop_run(request, task)
        # look at the active set again soon (that costs no store call), and in time for the
        # next extension
        soonest = min((t.extend_at for t in self.tracked.values()), default=now + LOOK)
        return max(min(soonest - now, LOOK), 0.05)

    def _stop_run(self, request: Any, task: Any) -> None:
        """Terminate the pool process of a run whose lease is about to end unrenewed."""
        if self.pool is None or not getattr(request, "worker_pid", None):
            return
        logger.error(
            "django_debounce: the lease of %s[%s] could not be renewed; stopping the run so that "
            "its redo never overlaps it",
            task.name,
            request.id,
        )
        try:
            request.terminate(self.pool, signal="SIGKILL")
            self.terminated += 1
        except Exception:
            logger.exception("django_debounce: could not stop %s[%s]", task.name, request.id)
        self.tracked.pop(request.id, None)

    def run(self) -> None:
        from django_debounce.dbconn import thread_tick

        while not self._stop.is_set():
            try:
                with thread_tick():
                    every = self.tick()
            except Exception:
                logger.exception("django_debounce: lease keeper tick failed")
                every = 1.0
            self._stop.wait(every)

    def start(self) -> None:
        from django_debounce.dbconn import closing

        self._stop.clear()
        self.thread = threading.Thread(
            target=closing(self.run), name="django-debounce lease keeper", daemon=True
        )
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self.thread is not None:
            self.thread.join(timeout=timeout)
