"""Property-based tests: each real store, driven directly (no worker), against the reference
model of ``django_debounce/machine.py`` under the same random sequence of operations.

Hypothesis draws one or two keys, each with its own task configuration (wait, max_wait,
leading, trailing, overlap, collect with a small collect_limit, lease) and a sequence of:
triggers (some with options of their own, every per-call option of
``tests/support/call_options.py``), steps of a fake clock, the pump taking due index entries
(``take``; some of whose publishes fail and are released), deliveries of published messages
(on time, early, twice, out of order, stale), in-process claims (``run_due``), finishes (ok,
retry after a backoff, final failure), heartbeats and the lease keeper's extensions, crashes
(a claimed run that never finishes), lost messages, flush, cancel, and operations at exactly
a lease's end.

After every operation the store's answers are compared with the model's (``TriggerResult``,
``Dispatch`` seq/countdown, ``FireDecision`` action, every ``Claim`` field), the store's state
(``live_state()``, ``due_keys()`` and the stored fields, the due index entry included, read
straight from the row or the Redis hash) with the model's, and invariants I1-I8 of
docs/design.md are checked on a ledger of every trigger, built from the store's answers. At
the end of each example everything left is run to completion (the pump takes what is due,
messages are delivered on time, runs finish), and every trigger must have been covered.

Every store call gets ``now=`` from the fake clock (integer microseconds starting at a fixed
time, 2030-01-01; each call advances it by 1 us so no two calls share a time): nothing that
is compared depends on the real clock, so a failing sequence replays exactly. No Celery worker
of the test session runs while this module runs (``no_workers`` in conftest.py): a worker's
pump and recorder act on keys at the real clock, which the model cannot follow.

Deterministic by default (``derandomize``). A long randomised exploration::

    DEBOUNCE_PROPERTY_RANDOM=1 DEBOUNCE_PROPERTY_EXAMPLES=2000 \
        scripts/test tests/stores/test_properties.py

(``DEBOUNCE_PROPERTY_STEPS``: steps per example; ``DEBOUNCE_PROPERTY_SHRINK=0``: report the
first failure unshrunk, much sooner).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
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

from django_debounce.backends import get_backend
from django_debounce.backends.base import LiveRun
from django_debounce.keys import dumps
from django_debounce.machine import US, Config, KeyModel, Msg, canon
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.state import Finish, FireAction, FlightOptions
from tests.support.call_options import call_options, resolve
from tests.support.peek import peek_database, peek_redis
from tests.support.workers import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_workers")]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
START = int(datetime(2030, 1, 1, tzinfo=UTC).timestamp()) * US
RETAKE = 5 * US  # DEBOUNCE_DISPATCH_GRACE during these tests
DIRECT = US  # DEBOUNCE_PUMP_INTERVAL during these tests
TASK = "testapp.prop"  # key i belongs to task TASK + str(i) (each its own configuration)
# Items and payload values: "10" sorts before "2" as text, '"a"' before both.
VALUES = [1, 2, 10, "a"]
STEPS = [1, 1000, US // 4, US // 2, US, 2 * US, 4 * US, 6 * US, 11 * US]

# Examples per store: a Redis step costs a fraction of a database one (row locks, commits).
EXAMPLES = {"redis": 300, "database": 100}
SETTINGS = settings(
    max_examples=50,
    stateful_step_count=int(os.environ.get("DEBOUNCE_PROPERTY_STEPS", "30")),
    deadline=None,
    derandomize=os.environ.get("DEBOUNCE_PROPERTY_RANDOM") != "1",
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate]
    + ([Phase.shrink] if os.environ.get("DEBOUNCE_PROPERTY_SHRINK", "1") == "1" else []),
)


def dt(value: int) -> datetime:
    return EPOCH + timedelta(microseconds=value)


def us(value: datetime | None) -> int | None:
    if value is None:
        return None
    return (value - EPOCH) // timedelta(microseconds=1)


@st.composite
def configs(draw: Any) -> Config:
    wait = draw(st.sampled_from([0, US // 2, 2 * US]))
    leading = draw(st.booleans())
    return Config(
        wait=wait,
        max_wait=draw(st.sampled_from([None, wait, wait + 3 * US // 2])),  # never below wait
        leading=leading,
        trailing=draw(st.booleans()) if leading else True,
        overlap=draw(st.booleans()),
        collect_limit=draw(st.sampled_from([None, 2, 3])),
        lease=draw(st.sampled_from([US, 3 * US, 10 * US])),
        # a byte budget per run that one or two of the drawn items fill
        collect_bytes=draw(st.sampled_from([None, 4, 9])),
    )


def options(cfg: Config) -> FlightOptions:
    return FlightOptions(
        wait=cfg.wait / US,
        max_wait=None if cfg.max_wait is None else cfg.max_wait / US,
        leading=cfg.leading,
        trailing=cfg.trailing,
        overlap=cfg.overlap,
        collect_limit=cfg.collect_limit,
        lease=cfg.lease / US,
        collect_bytes=cfg.collect_bytes if cfg.collect_limit is not None else None,
    )


# -- the ledger: what happened to every trigger, from the store's answers -----------------


@dataclass
class Rec:
    """One accepted (or dropped) trigger."""

    id: int
    at: int
    payload: Any
    due: int | None
    status: str = "pending"  # pending, claimed, cancelled, dropped
    run: int | None = None
    exempt: bool = False  # flushed, or in a flight due at once (leading edge, full batch)
    attempted: bool = False  # a run that covered it failed or was lost


@dataclass
class RunT:
    run_id: int
    claim_at: int
    lease_end: int
    triggers: int
    seq: int | None
    status: str = "live"  # live, ok, failed, retried, lost, superseded, returned
    crashed: bool = False
    started: bool = True  # False: a flush claimed it and its message has not started it


@dataclass
class Key:
    index: int
    name: str
    hash: str
    task: str
    cfg: Config
    model: KeyModel
    recs: list[Rec] = field(default_factory=list)
    runs: dict[int, RunT] = field(default_factory=dict)
    not_before: int | None = None
    flights: set[int] = field(default_factory=set)
    claimed_by: set[int] = field(default_factory=set)  # messages (seqs) that claimed
    touched: int = 0  # time of the last operation that recovers a lost lease


@dataclass
class Message:
    key: int
    seq: int
    due: int


@dataclass
class Running:
    key: int
    run_id: int
    seq: int | None


def clean() -> None:
    from tests.support.helpers import flush_redis

    flush_redis()  # every node of a Redis Cluster in the cluster run
    DebounceRun.objects.all().delete()
    DebounceKey.objects.all().delete()
    from django_debounce.models import DebounceDue

    DebounceDue.objects.all().delete()


class StoreAgainstModel(RuleBasedStateMachine):
    """Drives the store named by ``DEBOUNCE_BACKEND`` and the model side by side."""

    def __init__(self) -> None:
        super().__init__()
        running = sorted(w.queue for w in Worker.live if w.running)
        assert not running, (
            f"Celery workers of queues {running} run beside the property test: their pumps "
            "would act on the keys at the real clock (use the no_workers fixture)"
        )
        clean()
        self.backend = get_backend()
        self.store = self.backend.name
        self.now = START
        self.keys: list[Key] = []
        self.pool: list[Message] = []
        self.running: list[Running] = []
        self.made = 0

    # -- plumbing ---------------------------------------------------------------------------

    def tick(self) -> int:
        now = self.now
        self.now += 1
        return now

    def peek(self, key: Key) -> dict[str, Any] | None:
        if self.store == "redis":
            return peek_redis(self.backend, key.hash, key.cfg)
        return peek_database(key.hash, key.cfg.collect)

    def payload(self, key: Key, value: Any) -> Any:
        return value if key.cfg.collect else {"args": [value], "kwargs": {}}

    def same_dispatch(self, key: Key, real: Any, model: Msg | None, what: str) -> None:
        if model is None:
            assert real is None, f"{what}: store published {real}, model nothing"
            return
        assert real is not None, f"{what}: model published {model}, store nothing"
        assert real.key_hash == key.hash
        assert round(real.countdown * US) == model.countdown, f"{what}: {real} vs {model}"
        assert real.seq == model.seq, f"{what}: {real} vs {model}"

    def publish(self, key: Key, real: Any, model: Msg | None, now: int) -> None:
        if real is None or model is None:
            return
        self.pool.append(Message(key.index, real.seq, now + model.countdown))

    def after(self, key: Key, now: int, *, recovers: bool) -> None:
        """Ledger bookkeeping common to every operation of ``key`` at ``now``."""
        for run_id in key.model.events:
            run = key.runs[run_id]
            assert run.status == "live", f"run {run_id} lost twice"
            run.status = "lost"
            for rec in key.recs:
                if rec.status == "claimed" and rec.run == run_id:
                    rec.status, rec.run, rec.attempted = "pending", None, True
        key.model.events.clear()
        for run_id in key.model.returned:
            # a flush's run its message did not start: its triggers are pending again, with
            # no attempt made
            run = key.runs[run_id]
            assert run.status == "live" and not run.started, f"run {run} went back unstarted"
            run.status = "returned"
            for rec in key.recs:
                if rec.status == "claimed" and rec.run == run_id:
                    rec.status, rec.run = "pending", None
        key.model.returned.clear()
        if recovers:
            key.touched = now
        if key.model.pending and key.model.due_fixed:
            for rec in key.recs:
                if rec.status == "pending":
                    rec.exempt = True

    # -- setup --------------------------------------------------------------------------------

    @initialize(cfgs=st.lists(configs(), min_size=1, max_size=2))
    def setup(self, cfgs: list[Config]) -> None:
        for i, cfg in enumerate(cfgs):
            self.keys.append(
                Key(
                    index=i,
                    name=f"prop-{i}",
                    hash=f"{i:x}" * 64,
                    task=f"{TASK}{i}",
                    cfg=cfg,
                    model=KeyModel(cfg=cfg, retake=RETAKE, direct=DIRECT),
                )
            )

    # -- triggers -----------------------------------------------------------------------------

    @rule(
        k=st.integers(0, 1),
        value=st.sampled_from(VALUES),
        fails=st.booleans(),
        own=call_options(unit=US),
    )
    def trigger(
        self, k: int, value: Any, fails: bool = False, own: dict[str, int] | None = None
    ) -> None:
        """A trigger (``own``: the options it gives for itself, in microseconds, as
        ``debounce_wait=`` and the like give them: the store gets them as ``trigger()`` makes
        them, the model as its rules take them); when it returns a message to publish at once,
        the publish may fail (the broker is down): the caller releases it, the flight waits in
        the index (I8)."""
        key = self.keys[k % len(self.keys)]
        payload = self.payload(key, value)
        now = self.tick()
        own = own or {}
        opts = resolve(options(key.cfg), own, unit=US)
        result, dispatch = self.backend.trigger(
            task_name=key.task,
            key=key.name,
            key_hash=key.hash,
            payload_json=dumps(payload),
            options=opts,
            now=dt(now),
        )
        expected, mdispatch = key.model.trigger(now, payload, **own)
        self.after(key, now, recovers=True)
        got = (result.flight_id, result.pending, us(result.due_at), result.scheduled)
        want = (expected.flight_id, expected.pending, expected.due_at, expected.scheduled)
        if self.store == "redis" and result.due_at is None and expected.pending:
            want = (*want[:2], None, want[3])  # merged by a Redis counter: the row knows
        assert got == want, f"trigger {key.name}: store {got}, model {want}"
        assert result.key == key.name
        self.same_dispatch(key, dispatch, mdispatch, f"trigger {key.name}")
        self.made += 1
        rec = Rec(self.made, now, payload, expected.due_at)
        if not expected.pending:
            rec.status = "dropped"
        key.recs.append(rec)
        if dispatch is not None and mdispatch is not None:
            if fails:
                self.release(key, dispatch.seq)
            else:
                self.publish(key, dispatch, mdispatch, now)

    def release(self, key: Key, seq: int) -> None:
        now = self.tick()
        self.backend.release([self._dispatch(key, seq)], now=dt(now))
        key.model.release(now, seq)
        self.after(key, now, recovers=False)

    def _dispatch(self, key: Key, seq: int) -> Any:
        from django_debounce.state import Dispatch

        return Dispatch(key.hash, seq, 0.0, key.task)

    # -- time -----------------------------------------------------------------------------------

    @rule(step=st.sampled_from(STEPS))
    def clock(self, step: int) -> None:
        self.now += step

    @rule(
        k=st.integers(0, 1),
        what=st.sampled_from(["due", "running_until", "not_before", "taken_at", "entry"]),
        delta=st.sampled_from([-1, 0, 1]),
    )
    def jump(self, k: int, what: str, delta: int) -> None:
        """Move the clock to a boundary of a key's state: its due time, lease end, backoff
        end, message time or index entry (give or take one microsecond)."""
        model = self.keys[k % len(self.keys)].model
        target = getattr(model, what)
        if what == "taken_at" and target is not None:
            target += RETAKE
        if target is not None and target + delta > self.now:
            self.now = target + delta

    @precondition(lambda self: any(k.model.running_until is not None for k in self.keys))
    @rule(
        i=st.integers(0, 1),
        delta=st.sampled_from([-1, 0]),
        op=st.sampled_from(["heartbeat", "extend", "finish", "take", "run_due", "trigger"]),
    )
    def at_lease_end(self, i: int, delta: int, op: str) -> None:
        """An operation at exactly the end of a live run's lease, or 1 us before: where every
        operation must agree on whether the run is lost."""
        keys = [k for k in self.keys if k.model.running_until is not None]
        key = keys[i % len(keys)]
        assert key.model.running_until is not None
        self.now = max(self.now, key.model.running_until + delta)
        runs = [r for r in self.running if r.key == key.index and key.model.current(r.run_id)]
        if op == "heartbeat" and runs:
            self.heartbeat(self.running.index(runs[0]))
        elif op == "extend" and any(r.seq is not None for r in runs):
            run = next(r for r in runs if r.seq is not None)
            self.extend([r for r in self.running if r.seq is not None].index(run))
        elif op == "finish" and runs:
            self.finish(self.running.index(runs[0]), "ok", 0)
        elif op == "take":
            self.take(False)
        elif op == "run_due":
            self.run_due(key.index)
        else:
            self.trigger(key.index, VALUES[0])

    # -- the pump ---------------------------------------------------------------------------

    @rule(fails=st.booleans())
    def take(self, fails: bool) -> None:
        """The pump takes every due entry; when ``fails``, every publish fails and is
        released."""
        now = self.tick()
        tasks = {key.task: options(key.cfg) for key in self.keys}
        taken = self.backend.take(tasks, 1000, now=dt(now))
        real = {d.key_hash: d for d in taken.dispatches}
        assert len(real) == len(taken.dispatches), f"one key taken twice: {taken}"
        again = 0
        failed: list[tuple[Key, int]] = []
        for key in self.keys:
            model = key.model
            expected = None
            if model.entry is not None and model.entry <= now:
                expected, retaken = model.take(now)
                again += retaken
            self.after(key, now, recovers=True)
            dispatch = real.pop(key.hash, None)
            self.same_dispatch(key, dispatch, expected, f"take {key.name}")
            if dispatch is not None:
                assert dispatch.task_name == key.task
                if fails:
                    failed.append((key, dispatch.seq))
                else:
                    self.publish(key, dispatch, expected, now)
            if model.pending and model.running_until is None:
                # I7/I8: a flight is never left without a message or an index entry
                assert model.taken or model.entry is not None
        assert not real, f"take published for unknown keys: {real}"
        assert taken.again == again, f"re-taken: store {taken.again}, model {again}"
        left = [k.model.entry for k in self.keys if k.model.entry is not None]
        if taken.next_in is not None and left:
            # the store's hint may be early (a lower bound), never late
            assert round(taken.next_in * US) <= min(left) - now
        if left:
            assert taken.next_in is not None, "entries left, the store says none"
        for key, seq in failed:
            self.release(key, seq)

    # -- messages ---------------------------------------------------------------------------

    def deliver(self, msg: Message) -> None:
        key = self.keys[msg.key]
        self.fire(key, msg.seq, self.tick())

    def fire(self, key: Key, seq: int | None, now: int) -> None:
        cfg = key.cfg
        decision = self.backend.fire(
            key.hash, seq, task_name=key.task, options=options(cfg), now=dt(now)
        )
        expected = key.model.fire(now, seq)
        self.after(key, now, recovers=True)
        action = decision.action
        if expected.action == "missing":
            assert action in (FireAction.MISSING, FireAction.DROP)
            return
        assert action.value == expected.action, f"fire {key.name}: {decision} vs {expected}"
        self.same_dispatch(key, decision.dispatch, expected.dispatch, f"fire {key.name}")
        self.publish(key, decision.dispatch, expected.dispatch, now)
        if expected.claim is None:
            assert decision.claim is None
            return
        claim, want = decision.claim, expected.claim
        assert claim is not None
        got = (
            claim.run_id,
            claim.flight_id,
            claim.triggers,
            claim.payload,
            us(claim.first_trigger_at),
            us(claim.last_trigger_at),
            us(claim.due_at),
            us(claim.started_at),
            claim.attempt,
        )
        wanted = (
            want.run_id,
            want.flight_id,
            want.triggers,
            want.payload,
            want.first_trigger_at,
            want.last_trigger_at,
            want.due_at,
            want.started_at,
            want.attempt,
        )
        assert got == wanted, f"claim of {key.name}: store {got}, model {wanted}"
        assert (claim.key_hash, claim.key, claim.task_name) == (key.hash, key.name, key.task)
        if expected.flushed:
            self.ledger_start(key, claim, now, seq)
        else:
            self.ledger_claim(key, claim, now, seq)
        self.running.append(Running(key.index, claim.run_id, seq))

    def ledger_start(self, key: Key, claim: Any, now: int, seq: int | None) -> None:
        """The message of a flush starts the run the flush claimed: exactly the triggers
        pending at the flush, none that came after it."""
        run = key.runs[claim.run_id]
        assert seq is not None and run.seq == seq, f"run {run} started by message {seq}"
        assert run.status == "live" and not run.started, f"I5: run {run} started twice"
        run.started = True
        run.lease_end = now + key.cfg.lease
        covered = [r for r in key.recs if r.status == "claimed" and r.run == claim.run_id]
        # collect: the items say which triggers a run covers; its count takes every trigger
        # of the flight that repeated an item, also one whose item a cut left (ledger_claim)
        assert claim.triggers == run.triggers
        assert key.cfg.collect or len(covered) == claim.triggers, (
            f"flushed run {claim.run_id} of {claim.triggers} triggers, the flush took {covered}"
        )
        if key.cfg.collect:
            assert {canon(i) for i in claim.payload} == {canon(r.payload) for r in covered}
        else:
            newest = max(covered, key=lambda r: r.id)
            assert claim.payload == newest.payload, "the flushed run lost its last payload"

    def ledger_claim(self, key: Key, claim: Any, now: int, seq: int | None) -> None:
        cfg = key.cfg
        # I5: one claim per flight, one claim per delivered message
        assert claim.flight_id not in key.flights, f"I5: flight {claim.flight_id} claimed twice"
        key.flights.add(claim.flight_id)
        if seq is not None:
            assert seq not in key.claimed_by, f"I5: message {seq} claimed twice"
            key.claimed_by.add(seq)
        # I2: no two live runs of a key without overlap (lost runs are not live)
        still_live = [r for r in key.runs.values() if r.status == "live"]
        if not cfg.overlap:
            assert not still_live, f"I2: run {claim.run_id} claimed while {still_live} is live"
        for run in still_live:
            run.status = "superseded"  # overlap: the store follows only the newest run
        pending = [r for r in key.recs if r.status == "pending"]
        if cfg.collect:
            items = {canon(i) for i in claim.payload}
            covered = [r for r in pending if canon(r.payload) in items]
            backed = {canon(r.payload) for r in covered}
            assert items == backed, f"I1: claimed items {items - backed} of no trigger"
        else:
            covered = pending
            assert len(covered) == claim.triggers, f"I6: claim of {claim.triggers}, {covered}"
            newest = max(covered, key=lambda r: r.id)
            assert claim.payload == newest.payload, "the run does not get the last payload"
        # I3: no claim before the due time its last trigger gave the flight (each trigger
        # restarts the timer with its own wait, as lodash's; flush, leading edges and full
        # batches are due at once), nor before a retry's backoff
        last = max(covered, key=lambda r: (r.at, r.id), default=None)
        if last is not None:
            assert last.exempt or last.due is None or now >= last.due, (
                f"I3: claim at {now} before due {last.due} of its last trigger {last.id}"
            )
        for rec in covered:
            assert now >= rec.at
            rec.status, rec.run = "claimed", claim.run_id
        assert key.not_before is None or now >= key.not_before, "I3: claim before the backoff"
        key.not_before = None
        assert claim.due_at is None or now >= us(claim.due_at)
        key.runs[claim.run_id] = RunT(claim.run_id, now, now + cfg.lease, claim.triggers, seq)

    @precondition(lambda self: self.pool)
    @rule(i=st.integers(0, 50), twice=st.booleans())
    def deliver_now(self, i: int, twice: bool) -> None:
        """Deliver a published message at the current time (early, late, or again later)."""
        msg = self.pool[i % len(self.pool)]
        if not twice:
            self.pool.remove(msg)
        self.deliver(msg)

    @precondition(lambda self: self.pool)
    @rule(i=st.integers(0, 50))
    def deliver_on_time(self, i: int) -> None:
        msg = self.pool.pop(i % len(self.pool))
        self.now = max(self.now, msg.due)
        self.deliver(msg)

    @precondition(lambda self: self.pool)
    @rule(i=st.integers(0, 50))
    def lose_message(self, i: int) -> None:
        self.pool.pop(i % len(self.pool))

    @rule(k=st.integers(0, 1))
    def run_due(self, k: int) -> None:
        """An in-process claim (``run_due``): no message, no fencing."""
        key = self.keys[k % len(self.keys)]
        self.fire(key, None, self.tick())

    # -- runs -------------------------------------------------------------------------------

    @precondition(lambda self: self.running)
    @rule(
        i=st.integers(0, 50),
        outcome=st.sampled_from(["ok", "retry", "fail", "give_up"]),
        retry_in=st.sampled_from([0, US // 2, 2 * US]),
        fails=st.booleans(),
    )
    def finish(self, i: int, outcome: str, retry_in: int, fails: bool = False) -> None:
        """A run ends: ok, a failure to retry, a final failure, or given up without running
        (its attempts ran out: only its triggers that an attempt covered fail)."""
        run = self.running.pop(i % len(self.running))
        key = self.keys[run.key]
        now = self.tick()
        model = key.model
        applies = (
            model.current(run.run_id)
            and model.running_until is not None
            and model.running_until > now
        )
        ok = outcome == "ok"
        give_up = outcome == "give_up"
        retry = retry_in if outcome == "retry" else None
        back_items: set[str] | None = None
        covered = 0
        if applies and give_up and 0 < model.run_attempted < model._run_size():
            if key.cfg.collect:
                back_list = (model.run_payload or [])[model.run_attempted :]
                back_items = {canon(i) for i in back_list}
                covered = model.run_triggers - len(back_list)
            else:
                back_items = set()  # by the ledger's attempted flags
                covered = model.run_attempted
            claimed = [r for r in key.recs if r.status == "claimed" and r.run == run.run_id]
            if not key.cfg.collect:
                attempted = sum(1 for r in claimed if r.attempted)
                assert attempted == model.run_attempted, (
                    f"attempted triggers: ledger {attempted}, model {model.run_attempted}"
                )
        end = Finish(
            ok=ok,
            error="" if ok else "boom",
            retry_in=None if retry is None else retry / US,
            give_up=give_up,
        )
        real = self.backend.finish(
            key.hash,
            run.run_id,
            end,
            task_name=key.task,
            options=options(key.cfg),
            now=dt(now),
        )
        expected = model.finish(now, run.run_id, ok=ok, retry_in=retry, give_up=give_up)
        self.after(key, now, recovers=True)
        self.same_dispatch(key, real, expected, f"finish {key.name} run {run.run_id}")
        if real is not None and expected is not None:
            if fails:
                self.release(key, real.seq)
            else:
                self.publish(key, real, expected, now)
        ledger = key.runs[run.run_id]
        if not applies:
            return
        assert ledger.status == "live"
        if outcome == "retry":
            ledger.status = "retried"
            for rec in key.recs:
                if rec.status == "claimed" and rec.run == run.run_id:
                    rec.status, rec.run, rec.attempted = "pending", None, True
            key.not_before = now + retry_in
        else:
            ledger.status = "ok" if ok else "failed"
        if back_items is not None:
            # given up: the triggers no attempt covered go back to pending, due at once
            for rec in key.recs:
                if rec.status != "claimed" or rec.run != run.run_id:
                    continue
                goes = canon(rec.payload) in back_items if key.cfg.collect else not rec.attempted
                if goes:
                    rec.status, rec.run, rec.exempt = "pending", None, True
            ledger.triggers = covered

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 50))
    def heartbeat(self, i: int) -> None:
        run = self.running[i % len(self.running)]
        key = self.keys[run.key]
        now = self.tick()
        got = self.backend.heartbeat(
            key.hash,
            run.run_id,
            key.cfg.lease / US,
            task_name=key.task,
            options=options(key.cfg),
            now=dt(now),
        )
        want = key.model.heartbeat(now, run.run_id, key.cfg.lease)
        assert got == want, f"heartbeat of run {run.run_id}: store {got}, model {want}"
        if want:
            key.runs[run.run_id].lease_end = now + key.cfg.lease

    @precondition(lambda self: any(r.seq is not None for r in self.running))
    @rule(i=st.integers(0, 50))
    def extend(self, i: int) -> None:
        """The lease keeper extends the run a message claimed (in-process runs have none)."""
        runs = [r for r in self.running if r.seq is not None]
        run = runs[i % len(runs)]
        assert run.seq is not None
        key = self.keys[run.key]
        now = self.tick()
        live_run = LiveRun(key.hash, run.seq, key.cfg.lease / US, key.task, options(key.cfg))
        (got,) = self.backend.extend([live_run], now=dt(now))
        want = key.model.extend(now, run.seq, key.cfg.lease)
        if want is None:
            assert got is None, f"extend of run {run.run_id}: store {got}, model none"
        else:
            assert got is not None and round(got * US) == want - now, (got, want - now)
            key.runs[run.run_id].lease_end = want

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 50))
    def crash(self, i: int) -> None:
        """The worker of a claimed run dies: the run never finishes nor heartbeats."""
        run = self.running.pop(i % len(self.running))
        self.keys[run.key].runs[run.run_id].crashed = True

    # -- operators --------------------------------------------------------------------------

    @rule(k=st.integers(0, 1), fails=st.booleans())
    def flush(self, k: int, fails: bool = False) -> None:
        """A flush (lodash's ``flush()``): unless a live run blocks it, it claims the pending
        flight at once, and its message only starts that run (``ledger_start``); triggers
        after it belong to the next flight. The publish of its message may fail: the run
        goes back to pending (I8)."""
        key = self.keys[k % len(self.keys)]
        now = self.tick()
        before = key.model.run_id
        real = self.backend.flush(
            key.hash, task_name=key.task, options=options(key.cfg), now=dt(now)
        )
        expected = key.model.flush(now)
        self.same_dispatch(key, real, expected, f"flush {key.name}")
        self.after(key, now, recovers=True)
        if key.model.pending or key.model.run_id != before:
            for rec in key.recs:
                if rec.status == "pending":
                    rec.exempt = True
            key.not_before = None
        if key.model.run_id != before:
            # the flush claimed the flight: a run its message starts
            assert expected is not None and expected.seq == key.model.run_seq
            assert not key.model.run_started
            claim = key.model.run_claim()
            due = None if claim.due_at is None else dt(claim.due_at)
            self.ledger_claim(key, replace(claim, due_at=due), now, expected.seq)
            run = key.runs[claim.run_id]
            run.started, run.lease_end = False, now + RETAKE
            row = DebounceRun.objects.filter(debounce_key__key_hash=key.hash, run_id=claim.run_id)
            assert list(row.values_list("outcome", "triggers")) == [("running", claim.triggers)]
        if real is not None and expected is not None:
            if fails:
                self.release(key, real.seq)
            else:
                self.publish(key, real, expected, now)

    @rule(k=st.integers(0, 1))
    def cancel(self, k: int) -> None:
        key = self.keys[k % len(self.keys)]
        now = self.tick()
        got = self.backend.cancel(
            key.hash, task_name=key.task, options=options(key.cfg), now=dt(now)
        )
        want = key.model.cancel(now)
        assert got == want, f"cancel {key.name}: store {got}, model {want}"
        if want:
            for rec in key.recs:
                if rec.status == "pending":
                    rec.status = "cancelled"
            key.not_before = None
        self.after(key, now, recovers=False)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        if self.keys:
            tasks = [key.task for key in self.keys]
            got = {h for _t, h in self.backend.due_keys(dt(self.now), tasks)}
            want = {key.hash for key in self.keys if key.model.is_due(self.now)}
            if self.backend.name == "redis":  # the rows' due times: merges only move them later
                assert want <= got, f"due_keys: store {got}, model {want}"
                counted = self.backend.counted(sorted(got - want))
                assert set(counted) == got - want, f"due_keys: {got - want} counted {counted}"
            else:
                assert got == want, f"due_keys: store {got}, model {want}"
        for key in self.keys:
            model = key.model
            live = self.backend.live_state(key.hash)
            want = model.live_state()
            if want is None:
                assert live is None, f"{key.name}: store has state {live}, model none"
                continue
            assert live is not None, f"{key.name}: store has no state"
            got = {k: live[k] for k in want}
            assert got == want, f"live_state of {key.name}: store {got}, model {want}"
            view = self.peek(key)
            assert view is not None
            expected = model.view()
            diff = {f: (view.get(f), expected[f]) for f in expected if view.get(f) != expected[f]}
            assert not diff, f"state of {key.name} (store, model): {diff}"
            self.invariants_of(key, live)

    def invariants_of(self, key: Key, live: dict[str, Any]) -> None:
        counted = [
            r for r in key.runs.values() if r.status in ("live", "ok", "failed", "superseded")
        ]
        # I6 bookkeeping (the store's counters against the claims it handed out)
        assert live["pending"] >= 0
        assert live["triggers"] == len(key.recs), "I6: triggers counted vs made"
        assert live["triggers"] == (
            sum(r.triggers for r in counted) + live["pending"] + live["cancelled"]
        ), f"I6: {live} vs runs {counted}"
        assert live["runs"] == len(counted)
        assert live["merged"] == sum(r.triggers - 1 for r in counted)
        # I1 nothing lost
        pending = [r for r in key.recs if r.status == "pending"]
        for rec in key.recs:
            assert rec.status in ("pending", "claimed", "cancelled", "dropped")
            if rec.status == "claimed":
                assert rec.run is not None
                run = key.runs[rec.run]
                assert run.status in ("live", "ok", "failed", "superseded"), (
                    f"I1: trigger {rec.id} is left with run {run}"
                )
                assert run.claim_at >= rec.at
        view = key.model.view()
        if key.cfg.collect:
            want = {canon(r.payload) for r in pending}
            got = {canon(i) for i in view["payload"]}
            assert want == got, f"I1: pending items {got}, pending triggers {want}"
        else:
            assert len(pending) == live["pending"], f"I1: {len(pending)} triggers vs {live}"
            cancelled = [r for r in key.recs if r.status in ("cancelled", "dropped")]
            assert len(cancelled) == live["cancelled"]
            if pending:
                newest = max(pending, key=lambda r: r.id)
                assert view["payload"] == newest.payload, "the flight lost its last payload"
        # I7 crash safety: a crashed run is lost once an operation sees its lease ran out
        for run in key.runs.values():
            if run.crashed and run.status == "live":
                assert run.lease_end > key.touched, f"I7: run {run} outlived its lease"

    # -- the end: run everything left ---------------------------------------------------

    def teardown(self) -> None:
        if not self.keys or sys.exc_info()[0] is not None:
            return  # not set up, or a step failed: that failure is the report
        for _round in range(200):
            while self.running:
                self.finish(0, "ok", 0)
            if self.pool:
                first = min(range(len(self.pool)), key=lambda i: self.pool[i].due)
                self.deliver_on_time(first)
                continue
            busy = [k.model for k in self.keys if k.model.entry is not None]
            if not busy:
                break
            self.now = max(self.now, min(m.entry for m in busy if m.entry is not None))
            self.take(False)
            self.agrees_with_the_model()
        else:
            raise AssertionError("the keys did not become idle")
        self.agrees_with_the_model()
        for key in self.keys:
            left = [r for r in key.recs if r.status == "pending"]
            assert not left, f"I1: triggers never covered: {left}"


def test_store_agrees_with_the_model(store: str) -> None:
    """Each store (Redis; the database under test) against the model, I1-I8 after each step."""
    examples = int(os.environ.get("DEBOUNCE_PROPERTY_EXAMPLES", EXAMPLES[store]))
    # A prefix of its own: the recorder of a worker that runs meanwhile (the suite's) drains
    # the records of the "debounce" prefix, and would write rows this test deletes.
    with override_settings(
        DEBOUNCE_DISPATCH_GRACE=RETAKE / US,
        DEBOUNCE_PUMP_INTERVAL=DIRECT / US,
        DEBOUNCE_REDIS_PREFIX="debounce-property",
    ):
        run_state_machine_as_test(
            StoreAgainstModel, settings=settings(SETTINGS, max_examples=examples)
        )


def test_no_worker_runs_beside_the_property_test() -> None:
    """The workers this session started earlier are stopped while this module runs
    (``no_workers``), and the state machine refuses to start beside one."""
    assert not [w.queue for w in Worker.live if w.running]
    worker = Worker(concurrency=1, queue="debounce-props")
    worker.start()
    try:
        with pytest.raises(AssertionError, match=r"queues \['debounce-props'\]"):
            StoreAgainstModel()
    finally:
        worker.stop()
    assert StoreAgainstModel().keys == []
