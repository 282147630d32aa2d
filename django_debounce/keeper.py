"""The lease keeper: extends the leases of a worker's live runs from its main process, and
stops a run whose lease cannot be renewed or was lost (docs/design.md, "Dispatch at scale",
"The lease keeper")."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django_debounce import registry, runtable
from django_debounce.backends.base import LiveRun
from django_debounce.dispatch import DISPATCH_KWARG, parse_message
from django_debounce.pump import Ticker

logger = logging.getLogger("django_debounce")

# Seconds before a lease ends by which a run whose lease could not be renewed is stopped.
MARGIN = 2.0
# Longest sleep between two looks at the active runs (a look costs no store call): a run that
# starts while the keeper waits to extend a long lease is seen this soon, whatever its lease.
LOOK = 0.5


# Why a run is stopped (the log line says it).
UNRENEWED = "its lease could not be renewed (the store unreachable) before it ends"
LOST = "the store says its lease was lost"


@dataclass
class _Tracked:
    deadline: float  # wall-clock time until which the lease is known to hold
    lease: float
    claimed: bool = False
    extend_at: float = 0.0  # when its lease is extended next (0: at the next look)


class LeaseKeeper(Ticker):
    """Extends the leases of the live debounced runs of one worker."""

    NAME = "lease keeper"

    def __init__(self) -> None:
        super().__init__()
        self.tracked: dict[str, _Tracked] = {}
        self.unstoppable: set[str] = set()  # requests it could not stop (logged once each)

    def live(self) -> list[tuple[Any, Any, Any]]:
        """``(request, task, message)`` of every active request that is a debounced run."""
        from celery.worker import state

        out = []
        for request in list(state.active_requests):
            task = getattr(request, "task", None)
            if not registry.is_debounced(task):
                continue
            try:
                kwargs = request.kwargs or {}
            except Exception:
                continue
            message = parse_message(kwargs.get(DISPATCH_KWARG))
            if message is None:
                continue
            out.append((request, task, message))
        return out

    def tick(self) -> float:
        """Extend the lease of every live run that is due for it (a run new to the keeper at
        once, then every third of its lease), and stop a run when a fresh store call says its
        lease is lost, or fails past its deadline (``_stop_run``). Returns the seconds until
        the next tick (at most ``LOOK``)."""
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
            if now < tracked.extend_at and now < tracked.deadline - _margin(tracked):
                continue
            run = LiveRun(message.key_hash, message.seq, options.lease, task.name, options)
            by_store[task.get_backend()].append((request, task, message, run))
        for request_id in list(self.tracked):
            if request_id not in seen:
                del self.tracked[request_id]
        self.unstoppable &= seen.keys()
        for backend, items in by_store.items():
            # Which of these runs their pool process executes before the store is asked: a
            # run it says is not live then had been claimed, so it is lost (or has finished).
            before = self._claimed(items)
            asked = time.time()
            failed = False
            try:
                ends = backend.extend([item[3] for item in items])
            except Exception as exc:
                logger.warning("django_debounce: could not extend leases (%s)", exc)
                ends = [None] * len(items)
                failed = True
            answered = time.time()
            for (request, task, message, _run), end in zip(items, ends, strict=True):
                tracked = self.tracked[request.id]
                # every run's lease is extended at least three times per lease
                tracked.extend_at = answered + tracked.lease / 3.0
                if end is not None:
                    tracked.deadline = asked + end
                    tracked.claimed = True
                elif failed:
                    if answered >= tracked.deadline - _margin(tracked):
                        self._stop_run(request, task, message, UNRENEWED)
                elif tracked.claimed or before[request.id]:
                    # The store says the run is not live: it finished (the request leaves
                    # the active set in a moment; its process no longer says it runs it),
                    # or its lease was lost (ran out during a stall): stop it now.
                    self._stop_run(request, task, message, LOST)
        # look at the active set again soon (that costs no store call), and in time for the
        # next extension
        now = time.time()
        soonest = min((t.extend_at for t in self.tracked.values()), default=now + LOOK)
        return max(min(soonest - now, LOOK), 0.05)

    @staticmethod
    def _claimed(items: list[tuple[Any, Any, Any, LiveRun]]) -> dict[str, bool]:
        """Per request id: whether its pool process says it executes that run (one read of
        the run table)."""
        table = runtable.TABLE
        out = dict.fromkeys((item[0].id for item in items), False)
        if table is None:
            return out
        try:
            snapshot = table.snapshot()
            for request, _task, message, _run in items:
                pid = getattr(request, "worker_pid", None)
                if pid:
                    out[request.id] = table.claimed(snapshot, pid, message.key_hash, message.seq)
        except (OSError, ValueError):
            logger.exception("django_debounce: could not read the run table")
        return out

    def _stop_run(self, request: Any, task: Any, message: Any, why: str) -> None:
        """Kill the pool process of a run whose lease could not be renewed or was lost, if
        that process still executes it (checked now, under its slot's lock); Celery then fails
        the task with ``WorkerLostError`` and the run is redone after its lease."""
        table = runtable.TABLE
        pid = getattr(request, "worker_pid", None)
        if not pid:
            return  # not started in a pool process yet
        if table is None:
            # not a prefork pool: a run that finished looks lost too; say it only when the
            # store could not be reached
            if why == UNRENEWED and request.id not in self.unstoppable:
                self.unstoppable.add(request.id)
                logger.error(
                    "django_debounce: cannot stop %s[%s] (key %s): %s; this pool cannot "
                    "stop one run, so its redo may overlap it",
                    task.name,
                    request.id,
                    message.key_hash,
                    why,
                )
            return
        try:
            key = table.stop(pid, message.key_hash, message.seq)
        except (OSError, ValueError):
            logger.exception("django_debounce: could not stop %s[%s]", task.name, request.id)
            return
        if key is None:
            return  # that run has ended in that process (or is not running there)
        logger.error(
            "django_debounce: stopped %s[%s] (key %r) by killing pool process %d: %s; "
            "Celery records the task as failed (WorkerLostError) and its flight is redone",
            task.name,
            request.id,
            key or message.key_hash,
            pid,
            why,
        )
        self.tracked.pop(request.id, None)


def _margin(tracked: _Tracked) -> float:
    """Seconds before a run's deadline at which it is stopped when its lease is not renewed."""
    return min(MARGIN, tracked.lease / 4)
