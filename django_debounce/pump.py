"""The pump: publishes the dispatch messages of due flights from the store's due index, in a
worker's main process or ``manage.py debounce_pump`` (docs/design.md, "Dispatch at scale")."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from kombu.common import Broadcast

from django_debounce import conf, observe, registry
from django_debounce.backends.base import BaseBackend
from django_debounce.dbconn import closing, fork_pending, thread_tick
from django_debounce.dispatch import RETRY_POLICY, is_eager, publish
from django_debounce.state import Dispatch

logger = logging.getLogger("django_debounce")


@dataclass
class PumpStats:
    """What the pumps of this process did (for ``debounce_status`` and the metrics)."""

    published: int = 0
    again: int = 0
    released: int = 0
    ticks: int = 0
    last_tick_seconds: float = 0.0
    capped: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


stats = PumpStats()


def queue_of(task: Any) -> str | None:
    """The queue Celery routes ``task``'s messages to (``None`` when it cannot tell)."""
    try:
        route = task.app.amqp.router.route(dict(getattr(task, "debounce_route", {})), task.name)
        queue = route.get("queue")
        return getattr(queue, "name", queue)
    except Exception:  # a router that needs arguments: no cap for it
        return None


class Ticker:
    """A thread of the worker's main process (the pump, the lease keeper): ``run()`` calls
    ``tick()`` until ``stop()``, sleeping the seconds each tick returns, shortened by up to
    ``JITTER`` of them (a second after a tick that raised)."""

    NAME = ""
    JITTER = 0.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def tick(self) -> float:
        raise NotImplementedError

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                with thread_tick():
                    sleep = self.tick()
            except Exception:  # a bad setting, a store down: log, wait, try again
                logger.exception("django_debounce: %s tick failed", self.NAME)
                sleep = 1.0
            if sleep > 0:
                self._stop.wait(sleep * (1 - random.random() * self.JITTER))
            elif not self._stop.is_set():
                time.sleep(0)  # yield the GIL between back-to-back ticks

    def start(self) -> None:
        """Run in a daemon thread of this process."""
        self._stop.clear()
        self.thread = threading.Thread(
            target=closing(self.run), name=f"django-debounce {self.NAME}", daemon=True
        )
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current tick."""
        self._stop.set()
        if self.thread is not None:
            self.thread.join(timeout=timeout)


class Pump(Ticker):
    """One pump: ``tick()`` publishes what is due now and returns how long to sleep (its
    thread sleeps up to 10% less). ``tasks`` (name -> task) defaults to the registered
    debounced tasks, read at every tick. A batch taken and not published when it stops is
    taken again after ``DEBOUNCE_DISPATCH_GRACE``."""

    NAME = "pump"
    JITTER = 0.1

    def __init__(self, app: Any = None, tasks: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.app = app
        self._tasks = tasks
        self._seen = (stats.published, stats.again)
        self._drained: set[str | None] = set()  # queues given their quarter second

    # -- one tick ---------------------------------------------------------------------------

    def tick(self) -> float:
        """Publish every flight due now (in batches); returns the seconds until the earliest
        entry left (at most ``DEBOUNCE_PUMP_INTERVAL``)."""
        started = time.monotonic()
        interval = max(conf.seconds_of("PUMP_INTERVAL"), conf.MIN_INTERVAL)
        batch = int(conf.get("PUMP_BATCH"))
        sleep = interval
        for backend, tasks in registry.by_store(self._tasks).items():
            try:
                sleep = min(sleep, self._pump(backend, tasks, batch))
            except Exception:
                logger.exception("django_debounce: pump tick failed for the %s store", backend.name)
        seconds = time.monotonic() - started
        with stats.lock:
            stats.ticks += 1
            stats.last_tick_seconds = seconds
            published, again = stats.published - self._seen[0], stats.again - self._seen[1]
            self._seen = (stats.published, stats.again)
        observe.pumped(published, again, seconds)
        return max(sleep, 0.0)

    def _pump(self, backend: BaseBackend, tasks: dict[str, Any], batch: int) -> float:
        """Take and publish until nothing is due (or the queues are full), one queue at a
        time; the sleep after."""
        interval = conf.seconds_of("PUMP_INTERVAL")
        next_in = backend.peek(list(tasks))
        if next_in is None:
            return interval
        if next_in > 0:
            return min(next_in, interval)
        queues: dict[str | None, dict[str, Any]] = defaultdict(dict)
        for name, task in tasks.items():
            queues[queue_of(task)][name] = task
        sleep = interval
        capped: set[str] = set()
        for queue, group in queues.items():
            sleep = min(sleep, self._fill(backend, queue, group, batch, capped))
            if fork_pending():  # the pool forks: end this tick, the next one goes on
                sleep = 0.0
                break
        with stats.lock:
            stats.capped = capped
        return sleep

    def _fill(
        self,
        backend: BaseBackend,
        queue: str | None,
        tasks: dict[str, Any],
        batch: int,
        capped: set[str],
    ) -> float:
        """Take and publish the due flights of ``tasks`` (all routed to ``queue``) in batches,
        until none is due, the queue is full (added to ``capped``) or the broker refuses; the
        sleep after. Each take is at most the room the queue has left under the cap
        (``_room``): a pump alone never fills a queue past it, and pumps that take for one
        queue at the same moment pass it by at most one batch each."""
        interval = conf.seconds_of("PUMP_INTERVAL")
        options = registry.options(tasks)
        # a queue near its cap gets a quarter second to drain before a take smaller than a
        # quarter of the cap (or a batch): topping it up a few messages at a time would cost
        # a take and a depth read per few runs
        least = min(batch, max(int(conf.get("PUMP_QUEUE_CAP")) // 4, 1))
        while True:
            room = self._room(next(iter(tasks.values())), queue)
            limit = batch if room is None else min(batch, room)
            if limit <= 0:
                capped.add(str(queue))
                return min(interval, 0.5)
            if limit < least and queue not in self._drained:
                self._drained.add(queue)
                return min(interval, 0.25)
            self._drained.discard(queue)
            taken = backend.take(options, limit)
            refused = self._publish(backend, queue, tasks, taken.dispatches)
            with stats.lock:
                stats.again += taken.again
            if taken.next_in is None or refused:
                return interval
            if taken.next_in > 0 or len(taken.dispatches) < limit or fork_pending():
                return min(max(taken.next_in, 0.0), interval)

    def _publish(
        self,
        backend: BaseBackend,
        queue: str | None,
        tasks: dict[str, Any],
        dispatches: list[Dispatch],
    ) -> bool:
        """Publish ``dispatches`` (of ``tasks``, routed to ``queue``; none in eager mode); if
        the broker refuses any, the whole batch goes back to the due index (returns True)."""
        first = next(iter(tasks.values()))
        if not dispatches or is_eager(first):
            return False
        app = self.app or first.app
        failed = [d for d in dispatches if d.task_name not in tasks]  # not ours: left for later
        ours = [d for d in dispatches if d.task_name in tasks]
        refused = False
        try:
            with app.producer_or_acquire() as producer:
                options: dict[str, Any] = {"producer": producer}
                entity = None if queue is None else app.amqp.queues[queue]
                pinned = entity is not None and not isinstance(entity, Broadcast)
                if pinned:  # declared once per batch (design.md); the messages go to it
                    producer.maybe_declare(entity, retry=True, **RETRY_POLICY)
                    options["queue"] = queue
                batch = producer.batch() if hasattr(producer, "batch") else nullcontext()
                with batch:  # kombu >= 5.7: one Redis pipeline per 1,000 commands
                    for d in ours:  # (a declare list of its own for each message)
                        publish(tasks[d.task_name], d, declare=[] if pinned else None, **options)
        except Exception as exc:
            # some may have gone out: each starts its flight or is dropped (design.md)
            refused = True
            logger.warning(
                "django_debounce: pump could not publish a batch of %d dispatch messages (%s); "
                "their flights wait in the due index until the broker takes messages again",
                len(ours),
                exc,
            )
            failed += ours
        if failed:
            try:
                backend.release(failed)
            except Exception:
                logger.exception("django_debounce: could not release %d dispatches", len(failed))
        with stats.lock:
            stats.published += 0 if refused else len(ours)
            stats.released += len(failed)
        return refused

    def _room(self, task: Any, queue: str | None) -> int | None:
        """How many more messages ``queue`` takes under ``DEBOUNCE_PUMP_QUEUE_CAP`` by the depth
        the broker reports now (0 or less: none; ``None``: no cap, or the queue unknown)."""
        cap = int(conf.get("PUMP_QUEUE_CAP"))
        if cap <= 0 or queue is None:
            return None
        try:
            with task.app.connection_for_write() as conn:
                depth = int(conn.default_channel.queue_declare(queue=queue, passive=True)[1])
        except Exception:  # an empty Redis queue (no key), or a transport that cannot tell
            depth = 0
        return cap - depth
