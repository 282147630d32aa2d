"""lodash's ``debounce`` on a fake clock, and a player that drives a real store the same way,
for the conformance cases of ``tests/stores/test_lodash.py``.

``Lodash`` is lodash 4.17.21's ``debounce`` (``lodash.js``, ``function debounce``; ``throttle``
is ``debounce`` with ``leading``, ``maxWait = wait``, ``trailing``) transcribed line for line,
with ``Date.now``/``setTimeout``/``clearTimeout`` replaced by ``FakeLoop``.

A case is a *script*: steps ``(t, op, arg)`` at lodash times ``t`` in milliseconds, in order.
Both sides follow one event model, that of a lodash test with timers:

- the steps at one time run as one piece of synchronous code (a burst of calls "at once");
- a timer (lodash's own; ours: the pump taking a due index entry, or the worker taking a
  message) due at ``t`` runs after the steps at ``t`` and before any step after ``t`` (a step
  at ``t`` was written before the timer fired); at one time, messages go before the pump;
- lodash runs ``func`` inside the call on a leading edge, inside ``flush()``, and inside a call
  that finds ``maxWait`` reached (its tight-loop branch); our worker claims at once (no
  latency) a leading flight, a flushed one, and a flight that a trigger finds due by its
  ``max_wait`` bound (that trigger included), and any other flight when it falls due, after
  the steps at that time (a trigger made then is covered by that run).

Ops: ``call`` (one trigger with ``arg``), ``cancel``, ``flush``, ``look`` (observe only) and
``until`` (``arg = (n, value, every)``: call with ``value`` every ``every`` ms until ``n`` runs
have happened; a lodash test's ``while`` loop over a call whose return value says so).
After every step each side records what a lodash test can observe: how many times ``func``
ran so far and the argument of the latest run (the return value of lodash's ``debounced()``
for an identity ``func``; for a store, the payload of the latest claimed run).
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django_debounce.keys import dumps
from django_debounce.state import Dispatch, Finish, FireAction, FlightOptions

Step = tuple[float, str, Any]
US = 1000  # microseconds of the fake store clock per lodash millisecond
LEASE = 3600.0  # seconds: no lease runs out during a case
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Options:
    """The options of a debounced function, in lodash milliseconds."""

    wait: float
    max_wait: float | None = None
    leading: bool = False
    trailing: bool = True


def debounce(wait: float = 0, **options: Any) -> Options:
    """``_.debounce(func, wait, options)``'s options; ``maxWait`` is raised to ``wait`` as lodash
    (and our ``trigger``) does."""
    max_wait = options.get("maxWait")
    return Options(
        wait=wait,
        max_wait=None if max_wait is None else max(max_wait, wait),
        leading=options.get("leading", False),
        trailing=options.get("trailing", True),
    )


def throttle(wait: float = 0, **options: Any) -> Options:
    """``_.throttle(func, wait, options)``: a debounce with ``maxWait = wait``."""
    return Options(
        wait=wait,
        max_wait=wait,
        leading=options.get("leading", True),
        trailing=options.get("trailing", True),
    )


@dataclass
class Trace:
    """What one side did: ``runs`` as ``(time, arg)`` and, per step, ``(runs so far, arg of the
    latest run)``."""

    runs: list[tuple[float, Any]] = field(default_factory=list)
    seen: list[tuple[int, Any]] = field(default_factory=list)


# -- lodash ---------------------------------------------------------------------------------


class FakeLoop:
    """``setTimeout``/``clearTimeout`` and a clock; timers fire in (due, order) order."""

    def __init__(self) -> None:
        self.time = 0.0
        self.timers: list[tuple[float, int, Callable[[], Any]]] = []
        self.cancelled: set[int] = set()
        self.order = 0

    def set_timeout(self, fn: Callable[[], Any], delay: float) -> int:
        self.order += 1
        heapq.heappush(self.timers, (self.time + max(delay, 0), self.order, fn))
        return self.order

    def clear_timeout(self, timer: int) -> None:
        self.cancelled.add(timer)

    def run_before(self, t: float) -> None:
        """Fire every timer due before ``t`` (each at its due time)."""
        while self.timers and self.timers[0][0] < t:
            due, order, fn = heapq.heappop(self.timers)
            if order in self.cancelled:
                continue
            self.time = due
            fn()


class Lodash:
    """lodash 4.17.21's ``debounce`` (the closure's variables are attributes)."""

    def __init__(self, loop: FakeLoop, func: Callable[[Any], Any], options: Options) -> None:
        self.loop = loop
        self.func = func
        self.wait = options.wait
        self.leading = options.leading
        self.maxing = options.max_wait is not None
        self.max_wait = options.max_wait or 0
        self.trailing = options.trailing
        self.last_args: tuple[Any, ...] | None = None
        self.result: Any = None
        self.timer_id: int | None = None
        self.last_call_time: float | None = None
        self.last_invoke_time = 0.0

    def invoke_func(self, time: float) -> Any:
        args = self.last_args
        assert args is not None
        self.last_args = None
        self.last_invoke_time = time
        self.result = self.func(*args)
        return self.result

    def leading_edge(self, time: float) -> Any:
        self.last_invoke_time = time  # Reset any `maxWait` timer.
        self.timer_id = self.loop.set_timeout(self.timer_expired, self.wait)
        return self.invoke_func(time) if self.leading else self.result

    def remaining_wait(self, time: float) -> float:
        assert self.last_call_time is not None
        time_since_last_call = time - self.last_call_time
        time_since_last_invoke = time - self.last_invoke_time
        time_waiting = self.wait - time_since_last_call
        if self.maxing:
            return min(time_waiting, self.max_wait - time_since_last_invoke)
        return time_waiting

    def should_invoke(self, time: float) -> bool:
        if self.last_call_time is None:
            return True
        time_since_last_call = time - self.last_call_time
        time_since_last_invoke = time - self.last_invoke_time
        return (
            time_since_last_call >= self.wait
            or time_since_last_call < 0
            or (self.maxing and time_since_last_invoke >= self.max_wait)
        )

    def timer_expired(self) -> Any:
        time = self.loop.time
        if self.should_invoke(time):
            return self.trailing_edge(time)
        self.timer_id = self.loop.set_timeout(self.timer_expired, self.remaining_wait(time))
        return None

    def trailing_edge(self, time: float) -> Any:
        self.timer_id = None
        if self.trailing and self.last_args is not None:
            return self.invoke_func(time)
        self.last_args = None
        return self.result

    def cancel(self) -> None:
        if self.timer_id is not None:
            self.loop.clear_timeout(self.timer_id)
        self.last_invoke_time = 0
        self.last_args = self.last_call_time = self.timer_id = None

    def flush(self) -> Any:
        return self.result if self.timer_id is None else self.trailing_edge(self.loop.time)

    def __call__(self, *args: Any) -> Any:
        time = self.loop.time
        is_invoking = self.should_invoke(time)
        self.last_args = args
        self.last_call_time = time
        if is_invoking:
            if self.timer_id is None:
                return self.leading_edge(self.last_call_time)
            if self.maxing:
                # Handle invocations in a tight loop.
                self.loop.clear_timeout(self.timer_id)
                self.timer_id = self.loop.set_timeout(self.timer_expired, self.wait)
                return self.invoke_func(self.last_call_time)
        if self.timer_id is None:
            self.timer_id = self.loop.set_timeout(self.timer_expired, self.wait)
        return self.result


def lodash(options: Options, steps: Sequence[Step], *, then: Sequence[Any] = ()) -> Trace:
    """Run ``steps`` on lodash's debounce. ``then``: arguments the function, when it runs,
    calls the debounced function with, one per run, in order (a recursive call)."""
    loop = FakeLoop()
    trace = Trace()
    queue = list(then)

    def func(arg: Any) -> Any:
        trace.runs.append((loop.time, arg))
        if queue:
            debounced(queue.pop(0))
        return arg

    debounced = Lodash(loop, func, options)
    for t, op, arg in steps:
        loop.run_before(t)
        loop.time = t
        if op == "call":
            debounced(arg)
        elif op == "cancel":
            debounced.cancel()
        elif op == "flush":
            debounced.flush()
        elif op == "until":
            n, value, every = arg
            while True:
                debounced(value)
                if len(trace.runs) >= n:  # lodash ran func inside that call
                    break
                loop.run_before(loop.time + every)
                loop.time += every
        else:
            assert op == "look", op
        trace.seen.append((len(trace.runs), trace.runs[-1][1] if trace.runs else None))
    loop.run_before(float("inf"))
    return trace


# -- a store --------------------------------------------------------------------------------


TASK = "testapp.lodash"  # registered nowhere: the pump of a live worker never takes its entries


def dt(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def us_of(value: datetime) -> int:
    return (value - EPOCH) // timedelta(microseconds=1)


def flight_options(options: Options) -> FlightOptions:
    """The store's options of a debounced function (lodash milliseconds to seconds)."""
    return FlightOptions(
        wait=options.wait / 1000,
        max_wait=None if options.max_wait is None else options.max_wait / 1000,
        leading=options.leading,
        trailing=options.trailing,
        lease=LEASE,
    )


@dataclass
class Run:
    """A run the player's worker claimed: when (lodash ms), its argument, how many triggers."""

    at: float
    arg: Any
    triggers: int
    run_id: int


class Player:
    """Plays a script on a real store (``backend``, driven directly with ``now=``), with a pump
    and a worker, both without latency of their own:

    - the **pump** takes the key's due index entries (``take``) as soon as the fake clock
      reaches the earliest one (``peek``), and publishes what it takes;
    - every message (the pump's, and the direct dispatches that ``trigger``, ``fire``,
      ``finish`` and ``flush`` return) reaches the **worker** ``countdown`` (plus
      ``latency`` ms) after it was published; the worker ``fire``s it and runs the claimed
      run, whose body takes ``body`` ms, then finishes it.

    ``then``: the body triggers the key once more with the next of these arguments (while its
    run is live), as lodash's recursive calls do. ``takes`` lists the pump's takes as
    ``(lodash ms, messages taken)``; ``actions`` every fire's action."""

    def __init__(
        self,
        backend: Any,
        options: Options,
        *,
        name: str,
        t0: int,
        latency: float = 0,
        body: float = 0,
        then: Sequence[Any] = (),
    ) -> None:
        self.backend = backend
        self.options = options
        self.flight = flight_options(options)
        self.key = f"lodash:{name}"
        self.key_hash = hashlib.sha256(self.key.encode()).hexdigest()
        self.t0 = t0
        self.clock = t0
        self.latency = latency
        self.body = body
        self.then = list(then)
        self.trace = Trace()
        self.runs: list[Run] = []
        self.results: list[Any] = []  # each trigger's TriggerResult
        self.cancelled: list[int] = []  # what each cancel() returned
        self.flushed: list[bool] = []  # whether each flush() published the flight's message
        self.takes: list[tuple[float, int]] = []
        self.actions: list[FireAction] = []
        self.queue: list[tuple[int, int, str, Any]] = []
        self.order = 0

    # times: lodash ms <-> store microseconds
    def at(self, t: float) -> int:
        return self.t0 + round(t * US)

    def ms(self, us: int) -> float:
        return (us - self.t0) / US

    def push(self, due_us: int, kind: str, data: Any) -> None:
        self.order += 1
        heapq.heappush(self.queue, (due_us, self.order, kind, data))

    def publish(self, dispatch: Dispatch | None, now_us: int) -> None:
        """A message a step asked for: the worker gets it ``countdown`` (and ``latency``) later."""
        if dispatch is None:
            return
        assert dispatch.key_hash == self.key_hash, dispatch
        assert dispatch.countdown <= self.backend_interval() + 1e-9, dispatch
        due = now_us + round(dispatch.countdown * 1_000_000) + round(self.latency * US)
        self.push(due, "fire", dispatch)

    def backend_interval(self) -> float:
        from django_debounce import conf

        return conf.seconds_of("PUMP_INTERVAL")

    def entry(self) -> int | None:
        """The earliest due index entry of the key's task (a lower bound on Redis), in store
        microseconds; ``None`` when the index holds none."""
        seconds = self.backend.peek([TASK], now=dt(self.clock))
        return None if seconds is None else self.clock + round(seconds * 1_000_000)

    def pump(self, now_us: int) -> None:
        """The pump takes what is due at ``now_us`` and publishes it."""
        self.clock = now_us
        taken = self.backend.take({TASK: self.flight}, 100, now=dt(now_us))
        self.takes.append((self.ms(now_us), len(taken.dispatches)))
        assert taken.again == 0, f"a message taken again: {taken}"  # none is ever lost here
        for dispatch in taken.dispatches:
            assert (dispatch.task_name, dispatch.countdown) == (TASK, 0), dispatch
            self.publish(dispatch, now_us)
        after = self.entry()
        assert after is None or after > now_us, f"the take at {now_us} left an entry due"

    def run_before(self, due_us: int) -> None:
        """Everything that happens before ``due_us``: messages delivered, and the pump's takes
        when the clock reaches an index entry (a message due at the same time goes first)."""
        for _ in range(100_000):
            entry = self.entry()
            head = self.queue[0][0] if self.queue else None
            if head is not None and head < due_us and (entry is None or head <= entry):
                at, _order, kind, data = heapq.heappop(self.queue)
                self.handle(at, kind, data)
            elif entry is not None and entry < due_us:
                self.pump(max(entry, self.clock))
            else:
                return
        raise AssertionError("the key never became idle")

    def handle(self, now_us: int, kind: str, data: Any) -> None:
        self.clock = now_us
        if kind == "finish":
            follow = self.backend.finish(
                self.key_hash,
                data,
                Finish(ok=True),
                task_name=TASK,
                options=self.flight,
                now=dt(now_us),
            )
            self.publish(follow, now_us)
            return
        decision = self.backend.fire(
            self.key_hash,
            data.seq,
            task_name=TASK,
            options=self.flight,
            now=dt(now_us),
        )
        self.actions.append(decision.action)
        assert decision.action is not FireAction.MISSING, decision
        if decision.action is FireAction.REARM:
            self.publish(decision.dispatch, now_us)  # else the flight is back in the index
        elif decision.action is FireAction.CLAIM:
            claim = decision.claim
            assert claim is not None and us_of(claim.started_at) == now_us
            self.publish(decision.dispatch, now_us)  # none: no overlap, no collect
            arg = claim.payload[0]
            self.runs.append(Run(self.ms(now_us), arg, claim.triggers, claim.run_id))
            self.trace.runs.append((self.ms(now_us), arg))
            if self.then:  # the body calls the debounced function again
                self.trigger(now_us, self.then.pop(0))
            if self.body:
                self.push(now_us + round(self.body * US), "finish", claim.run_id)
            else:
                self.handle(now_us, "finish", claim.run_id)

    def trigger(self, now_us: int, arg: Any) -> Any:
        self.clock = now_us
        result, dispatch = self.backend.trigger(
            task_name=TASK,
            key=self.key,
            key_hash=self.key_hash,
            payload_json=dumps([arg]),  # the task's arguments (no keyword arguments)
            options=self.flight,
            now=dt(now_us),
        )
        self.results.append(result)
        assert result.scheduled == (dispatch is not None), (result, dispatch)
        self.publish(dispatch, now_us)
        # lodash runs func inside the call on a leading edge, and when the call finds maxWait
        # reached: our worker claims such a flight at once (a trigger a Redis counter merged
        # has no due time of its own: what is due by now runs)
        o = self.options
        due = us_of(result.due_at) if result.due_at is not None else None
        if (due is None or due <= now_us) and (o.leading or o.max_wait is not None):
            if not self.latency:
                self.run_before(now_us + 1)
        return result

    def play(self, steps: Sequence[Step]) -> Trace:
        for t, op, arg in steps:
            now = self.at(t)
            self.run_before(now)
            self.clock = max(self.clock, now)
            if op == "call":
                self.trigger(now, arg)
            elif op == "cancel":
                self.cancelled.append(
                    self.backend.cancel(
                        self.key_hash, task_name=TASK, options=self.flight, now=dt(now)
                    )
                )
            elif op == "flush":
                dispatch = self.backend.flush(
                    self.key_hash, task_name=TASK, options=self.flight, now=dt(now)
                )
                self.flushed.append(dispatch is not None)
                self.publish(dispatch, now)
                if not self.latency:
                    self.run_before(now + 1)  # lodash's flush() runs func at once
            elif op == "until":
                n, value, every = arg
                while True:
                    self.trigger(now, value)
                    if len(self.runs) >= n:
                        break
                    now += round(every * US)
                    self.run_before(now)
                    self.clock = max(self.clock, now)
            else:
                assert op == "look", op
            self.trace.seen.append((len(self.runs), self.runs[-1].arg if self.runs else None))
        self.run_before(self.at(10**9))
        assert not self.queue and self.entry() is None, "the key never became idle"
        return self.trace


def calls(start: float, end: float, every: float, arg: Any = None) -> list[Step]:
    """A call every ``every`` ms from ``start`` up to ``end`` (inclusive)."""
    out: list[Step] = []
    t = start
    while t <= end:
        out.append((t, "call", arg))
        t += every
    return out
