"""lodash's cases on the rules alone: ``RulesPlayer`` plays a script of ``tests/support/lodash.py``
on one key's ``KeyModel`` (``django_debounce/machine.py``) with a fake clock, no store, the way
``lodash.Player`` plays it on a real store, with the same event model (see that module): a
pump that takes the key's entry as soon as the clock reaches it, and a worker that gets each
message ``countdown`` (plus ``latency`` ms) after it was published, claims, runs the body for
``body`` ms and finishes it. 1 lodash ms = 1000 us of the fake clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from django_debounce.machine import Config, KeyModel, Msg, TriggerOut
from tests.support.lodash import LEASE, US, Options, Run, Step, Trace

T0 = 1_893_456_000_000_000  # 2030-01-01 in microseconds: the fake clock's origin
GRACE = 60.0  # DEBOUNCE_DISPATCH_GRACE's default, seconds


def config(options: Options) -> Config:
    return Config(
        wait=round(options.wait * US),
        max_wait=None if options.max_wait is None else round(options.max_wait * US),
        leading=options.leading,
        trailing=options.trailing,
        overlap=False,
        collect_limit=None,
        lease=round(LEASE * 1_000_000),
    )


class RulesPlayer:
    """``lodash.Player`` on ``KeyModel``: ``interval`` is the pump interval in seconds (the
    rules' ``direct``); ``runs``, ``results`` (each trigger's ``TriggerOut``), ``cancelled``,
    ``flushed``, ``takes`` and ``actions`` as the store player's."""

    def __init__(
        self,
        options: Options,
        *,
        interval: float = 1.0,
        latency: float = 0,
        body: float = 0,
        then: Sequence[Any] = (),
    ) -> None:
        self.options = options
        self.direct = round(interval * 1_000_000)
        self.model = KeyModel(
            cfg=config(options), retake=round(GRACE * 1_000_000), direct=self.direct
        )
        self.t0 = T0
        self.clock = T0
        self.latency = latency
        self.body = body
        self.then = list(then)
        self.trace = Trace()
        self.runs: list[Run] = []
        self.results: list[TriggerOut] = []
        self.cancelled: list[int] = []
        self.flushed: list[bool] = []
        self.takes: list[tuple[float, int]] = []
        self.actions: list[str] = []
        self.queue: list[tuple[int, int, str, Any]] = []
        self.order = 0

    def at(self, t: float) -> int:
        return self.t0 + round(t * US)

    def ms(self, us: int) -> float:
        return (us - self.t0) / US

    def push(self, due_us: int, kind: str, data: Any) -> None:
        self.order += 1
        heapq.heappush(self.queue, (due_us, self.order, kind, data))

    def publish(self, msg: Msg | None, now_us: int) -> None:
        if msg is None:
            return
        assert 0 <= msg.countdown <= self.direct, msg
        self.push(now_us + msg.countdown + round(self.latency * US), "fire", msg)

    def entry(self) -> int | None:
        return self.model.entry

    def pump(self, now_us: int) -> None:
        self.clock = now_us
        msg, again = self.model.take(now_us)
        self.takes.append((self.ms(now_us), int(msg is not None)))
        assert not again, "a message taken again"  # none is ever lost here
        if msg is not None:
            assert msg.countdown == 0, msg
            self.publish(msg, now_us)
        after = self.entry()
        assert after is None or after > now_us, f"the take at {now_us} left an entry due"

    def run_before(self, due_us: int) -> None:
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
            self.publish(self.model.finish(now_us, data, ok=True, retry_in=None), now_us)
            return
        out = self.model.fire(now_us, data.seq)
        self.actions.append(out.action)
        assert out.action != "missing", out
        if out.action == "rearm":
            self.publish(out.dispatch, now_us)
        elif out.action == "claim":
            claim = out.claim
            assert claim is not None and claim.started_at == now_us, (claim, now_us)
            self.publish(out.dispatch, now_us)
            arg = claim.payload[0]
            self.runs.append(Run(self.ms(now_us), arg, claim.triggers, claim.run_id))
            self.trace.runs.append((self.ms(now_us), arg))
            if self.then:
                self.trigger(now_us, self.then.pop(0))
            if self.body:
                self.push(now_us + round(self.body * US), "finish", claim.run_id)
            else:
                self.handle(now_us, "finish", claim.run_id)

    def trigger(self, now_us: int, arg: Any) -> TriggerOut:
        self.clock = now_us
        result, msg = self.model.trigger(now_us, [arg])
        self.results.append(result)
        assert result.scheduled == (msg is not None), (result, msg)
        self.publish(msg, now_us)
        o = self.options
        due = result.due_at
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
                self.cancelled.append(self.model.cancel(now))
            elif op == "flush":
                msg = self.model.flush(now)
                self.flushed.append(msg is not None)
                self.publish(msg, now)
                if not self.latency:
                    self.run_before(now + 1)
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
        assert not self.model.pending and self.model.running_until is None
        return self.trace
