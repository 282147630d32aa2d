"""The rules of one key (``django_debounce/machine.py``) against invariants I1-I8, with no store:
Hypothesis drives ``KeyModel`` directly (one key, a fake clock) through random sequences, and
a ledger of every trigger (``tests/support/rules.py``) checks I1-I8 after each step.

Each example draws a task configuration (wait, max_wait, leading, trailing, overlap, collect
with a small limit and byte budget, lease) and a sequence of: triggers (some with options of
their own, every per-call option of ``tests/support/call_options.py``), triggers a Redis
counter absorbs (folded into the row by the next step that needs it, or lost when Redis
forgets the counter), clock steps and jumps to the key's boundaries (due time, lease end,
backoff end, message time, entry, give or take 1 us), the pump's takes (some of whose
publishes the broker refuses: released), deliveries of published messages (on time, early,
twice, stale) to worker A or B, lost messages, in-process claims (``run_due``), finishes (ok,
a retry after a backoff, a final failure, a give-up), crashes, heartbeats, the lease keeper's
extensions, flush and cancel. At the end everything left is run (``KeyLedger.drain``) and no
trigger may be left pending.

The same invariants as ``tests/stores/test_properties.py``, which holds each store to these
rules; here the rules are held to the invariants, hundreds of times faster.

Deterministic by default (``derandomize``). A longer random run::

    DEBOUNCE_RULES_RANDOM=1 DEBOUNCE_RULES_EXAMPLES=20000 python -m pytest \
        tests/unit/test_machine_properties.py

(``DEBOUNCE_RULES_STEPS``: steps per example, 40 by default; ``DEBOUNCE_RULES_SHRINK=0``:
report the first failure unshrunk.)
"""

from __future__ import annotations

import os
import sys
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_debounce.machine import US, Config
from tests.support.call_options import call_options
from tests.support.rules import KeyLedger

START = 1_893_456_000 * US  # 2030-01-01, as the store property test
RETAKE = 5 * US  # DEBOUNCE_DISPATCH_GRACE
DIRECT = US  # DEBOUNCE_PUMP_INTERVAL
VALUES = [1, 2, 10, "a"]
STEPS = [1, 1000, US // 4, US // 2, US, 2 * US, 4 * US, 6 * US, 11 * US]

EXAMPLES = int(os.environ.get("DEBOUNCE_RULES_EXAMPLES", "200"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=int(os.environ.get("DEBOUNCE_RULES_STEPS", "40")),
    deadline=None,
    derandomize=os.environ.get("DEBOUNCE_RULES_RANDOM") != "1",
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate]
    + ([Phase.shrink] if os.environ.get("DEBOUNCE_RULES_SHRINK", "1") == "1" else []),
)


@st.composite
def configs(draw: Any) -> Config:
    wait = draw(st.sampled_from([0, US // 2, 2 * US]))
    leading = draw(st.booleans())
    return Config(
        wait=wait,
        max_wait=draw(st.sampled_from([None, wait, wait + 3 * US // 2])),
        leading=leading,
        trailing=draw(st.booleans()) if leading else True,
        overlap=draw(st.booleans()),
        collect_limit=draw(st.sampled_from([None, None, 2, 3])),
        lease=draw(st.sampled_from([US, 3 * US, 10 * US])),
        collect_bytes=draw(st.sampled_from([None, 4, 9])),
    )


class RulesAgainstInvariants(RuleBasedStateMachine):
    """One key's rules, a ledger, and every party that acts on the key."""

    def __init__(self) -> None:
        super().__init__()
        self.key: KeyLedger | None = None

    @property
    def k(self) -> KeyLedger:
        assert self.key is not None
        return self.key

    def tick(self) -> None:
        self.k.now += 1  # no two operations share a time

    @initialize(cfg=configs())
    def setup(self, cfg: Config) -> None:
        self.key = KeyLedger(cfg, START, RETAKE, DIRECT)

    # -- triggers -----------------------------------------------------------------------

    @rule(value=st.sampled_from(VALUES), own=call_options(unit=US), fails=st.booleans())
    def trigger(self, value: Any, own: dict[str, int], fails: bool) -> None:
        self.tick()
        self.k.trigger(value, own, fails=fails)

    @precondition(lambda self: self.key is not None and self.key.can_count())
    @rule(n=st.integers(1, 3), gap=st.sampled_from([0, 1, US // 4]))
    def counted(self, n: int, gap: int) -> None:
        """Triggers a Redis counter absorbs (same payload and options as the flight's last
        row-path trigger); the next step that needs the row folds them."""
        for _ in range(n):
            self.k.now += gap + 1
            if not self.k.can_count():
                return
            self.k.count()

    @precondition(lambda self: self.key is not None and self.key.counter is not None)
    @rule()
    def forget(self) -> None:
        """Redis forgets the counter (evicted, expired, restarted empty)."""
        self.k.forget()

    # -- time ---------------------------------------------------------------------------

    @rule(step=st.sampled_from(STEPS))
    def clock(self, step: int) -> None:
        self.k.now += step

    @rule(
        what=st.sampled_from(["due", "running_until", "not_before", "taken_at", "entry"]),
        delta=st.sampled_from([-1, 0, 1]),
    )
    def jump(self, what: str, delta: int) -> None:
        """The clock to a boundary of the key's state, give or take one microsecond."""
        target = getattr(self.k.model, what)
        if what == "taken_at" and target is not None:
            target += RETAKE
        if target is not None and target + delta > self.k.now:
            self.k.now = target + delta

    # -- the pump and messages ----------------------------------------------------------

    @rule(fails=st.booleans())
    def take(self, fails: bool) -> None:
        self.tick()
        self.k.take(fails=fails)

    @precondition(lambda self: self.key is not None and self.key.pool)
    @rule(i=st.integers(0, 50), twice=st.booleans(), worker=st.sampled_from("AB"))
    def deliver_now(self, i: int, twice: bool, worker: str) -> None:
        """A published message arrives now: early, late, or (``twice``) again later."""
        self.tick()
        self.k.deliver(i % len(self.k.pool), worker, keep=twice)

    @precondition(lambda self: self.key is not None and self.key.pool)
    @rule(i=st.integers(0, 50), worker=st.sampled_from("AB"))
    def deliver_on_time(self, i: int, worker: str) -> None:
        index = i % len(self.k.pool)
        self.k.now = max(self.k.now, self.k.pool[index].due)
        self.k.deliver(index, worker)

    @precondition(lambda self: self.key is not None and self.key.delivered)
    @rule(worker=st.sampled_from("AB"))
    def redeliver(self, worker: str) -> None:
        """The last message delivered arrives again (a broker redelivery)."""
        self.tick()
        self.k.fire(self.k.delivered[-1], worker)

    @precondition(lambda self: self.key is not None and self.key.pool)
    @rule(i=st.integers(0, 50))
    def lose_message(self, i: int) -> None:
        self.k.pool.pop(i % len(self.k.pool))

    @rule(worker=st.sampled_from("AB"))
    def run_due(self, worker: str) -> None:
        """An in-process claim (``run_due``): no message, no fencing."""
        self.tick()
        self.k.fire(None, worker)

    # -- runs ---------------------------------------------------------------------------

    @precondition(lambda self: self.key is not None and self.key.open_runs())
    @rule(
        i=st.integers(0, 50),
        outcome=st.sampled_from(["ok", "ok", "retry", "fail", "give_up"]),
        retry_in=st.sampled_from([0, US // 2, 2 * US]),
        fails=st.booleans(),
    )
    def finish(self, i: int, outcome: str, retry_in: int, fails: bool) -> None:
        runs = self.k.open_runs()
        self.tick()
        self.k.finish(runs[i % len(runs)], outcome, retry_in, fails=fails)

    @precondition(lambda self: self.key is not None and self.key.open_runs())
    @rule(i=st.integers(0, 50))
    def crash(self, i: int) -> None:
        runs = self.k.open_runs()
        self.k.crash(runs[i % len(runs)])

    @precondition(lambda self: self.key is not None and self.key.open_runs())
    @rule(i=st.integers(0, 50), keeper=st.booleans())
    def heartbeat(self, i: int, keeper: bool) -> None:
        """The body's heartbeat, or (``keeper``) the lease keeper's extension by message."""
        runs = self.k.open_runs()
        self.tick()
        run = runs[i % len(runs)]
        if keeper:
            self.k.extend(run)
        else:
            self.k.heartbeat(run)

    @precondition(lambda self: self.key is not None and self.key.model.running_until is not None)
    @rule(
        delta=st.sampled_from([-1, 0]),
        op=st.sampled_from(["heartbeat", "extend", "finish", "take", "run_due", "trigger"]),
    )
    def at_lease_end(self, delta: int, op: str) -> None:
        """An operation at exactly the live run's lease end, or 1 us before."""
        model = self.k.model
        assert model.running_until is not None
        self.k.now = max(self.k.now, model.running_until + delta)
        runs = [r for r in self.k.open_runs() if model.current(r.run_id)]
        if op == "heartbeat" and runs:
            self.k.heartbeat(runs[0])
        elif op == "extend" and runs:
            self.k.extend(runs[0])
        elif op == "finish" and runs:
            self.k.finish(runs[0], "ok")
        elif op == "take":
            self.k.take()
        elif op == "run_due":
            self.k.fire(None)
        else:
            self.k.trigger(VALUES[0])

    # -- operators ----------------------------------------------------------------------

    @rule()
    def flush(self) -> None:
        self.tick()
        self.k.flush()

    @rule()
    def cancel(self) -> None:
        self.tick()
        self.k.cancel()

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def invariants(self) -> None:
        if self.key is not None:
            self.key.check()

    def teardown(self) -> None:
        if self.key is None or sys.exc_info()[0] is not None:
            return
        self.key.drain()


def test_the_rules_keep_the_invariants() -> None:
    """I1-I8 after every step of random sequences, and nothing left pending at the end."""
    run_state_machine_as_test(RulesAgainstInvariants, settings=SETTINGS)
