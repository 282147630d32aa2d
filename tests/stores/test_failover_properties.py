"""The fault table of docs/design.md ("One record per key", "The fault table") as tests: the
Redis store (``RedisBackend``: counters in Redis over the database rows) driven directly, no
Celery worker, on a ``redis-server`` of the test's own that the test breaks.

Every case checks, with the ledger of ``tests/support/ledger.py`` (built from the store's
answers, as tests/stores/test_properties.py builds its own): **0 triggers lost** (every
accepted trigger is covered by a run claimed after it that finished ok; while the ledger
holds a pending trigger of a key, so does its row), **0 finished runs repeated** (a claim
covers at least one and at most the pending triggers: never those of a finished run),
**0 flights stranded** (a row with something pending or running has a due index entry; after
Redis heals, the pump's take, the deliveries to ``fire`` and the finishes reach quiescence
with every row idle), **0 overlapping runs** (``overlap=False``: no claim while another run
of the key is live), **no error raised to a caller** (trigger, take, fire, finish, extend,
flush return whatever Redis does; only ``cancel`` may raise ``StoreUnavailable``, and then
changes nothing), and the counter fence (a live counter belongs to the flight its row
fences, and dies, in Redis's clock, no later than the row's ``counter_until``).

The cases, by line of the fault table:

1. any Redis key forgotten at any step (a counter or a tombstone DEL'd): the rule ``forget``
   of the state machine ``FaultMachine``, interleaved with triggers (one or a batch; with
   options of their own, every per-call option of ``tests/support/call_options.py``), the
   fake clock, takes (publishes refused and released), deliveries (on time, early, lost),
   in-process claims, finishes (ok, retry), the lease keeper, crashed runs, flush, cancel,
   and the faults of 3 (Redis stopped and restarted empty, out of memory, read-only,
   flushed): ``test_faults_at_any_step``;
2. Redis restarted empty, or flushed, with flights pending (300 keys with counters, messages
   out and runs live): ``test_redis_loses_everything_with_flights_pending``;
3. Redis refusing: ``OOM`` under ``noeviction`` (triggers take the row path and make no
   counter; seal, flagged ``allow-oom``, still seals, so a claim is not delayed),
   ``READONLY`` (the store's client on a replica) and unreachable (stopped) at trigger, at
   take and claim (they wait for ``counter_until``, then go on), at finish (never needs
   Redis), and ``cancel`` refused: ``test_out_of_memory``,
   ``test_claims_wait_for_the_fence``;
4. Redis full under ``allkeys-lru`` evicting while 800 keys are pending
   (``DEBOUNCE_FAULT_KEYS=20000`` for the issue's 20,000: a claim and a finish cost about
   15 ms a key on PostgreSQL, so CI runs 800; eviction of counters that absorbed triggers
   is asserted to happen):
   ``test_evicting_redis_with_many_keys_pending``;
5. Redis paused (SIGSTOP) longer than a counter's life, with the real clocks: calls time out
   (the client's ``socket_timeout``), a claim waits for ``counter_until``, and the merge and
   the open that the paused Redis runs when it resumes, after the counter's expiry ``x``,
   are refused: ``test_redis_paused_longer_than_a_counter_life``;
6. Redis's clock and the database's an hour apart (both ways): the scripts run on Redis
   with a ``now`` one hour off the rows' fake clock (``tests/support/faults.RedisClock``),
   the random steps of 1 and 3, and a counter's expiry checked to be the row's fence moved
   by exactly the offset: ``test_clocks_an_hour_apart``,
   ``test_a_counter_dies_at_the_fence_in_either_clock``;
7. a triggering process paused between its row write and its Redis write (the store's
   ``after_commit`` held back, run after a claim): its late ``open`` finds a tombstone, or
   its expiry passed: ``test_a_late_open_is_refused``;
8. a pump SIGKILLed mid-batch (its rows locked, its counters sealed) and three pumps on the
   same due entries, in processes of their own: ``test_pumps_killed_and_racing``.

A worker's main process or pool child SIGKILLed at any step is covered by
tests/worker/test_recovery.py, and a host stalled close to the lease by
tests/worker/test_keeper_stall.py.

Every case but 5 and 8's pumps gives the store ``now=`` from a fake clock (integer
microseconds from 2030-01-01, as test_properties.py), and the scripts get that clock too
(case 6: plus the offset), so nothing checked depends on the real clock. Redis's own key
expiry (``PEXPIRE``) still runs in real time, a few seconds after a counter's life: what it
forgets is a case of line 1.

Deterministic by default (Hypothesis ``derandomize``). A long randomised run::

    DEBOUNCE_FAULT_RANDOM=1 DEBOUNCE_FAULT_EXAMPLES=1000 DEBOUNCE_FAULT_KEYS=20000 \\
        scripts/test tests/stores/test_failover_properties.py

(``DEBOUNCE_FAULT_STEPS``: the most steps per example; ``DEBOUNCE_PROPERTY_SHRINK=0``:
report the first failure unshrunk.)
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
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

from django_debounce.backends.redis import RedisBackend, fingerprint
from django_debounce.backends.rows import to_us
from django_debounce.keys import dumps
from django_debounce.models import DebounceDue, DebounceKey, DebounceRun
from django_debounce.state import Dispatch, FireAction, FlightOptions
from tests.support.call_options import call_options
from tests.support.faults import FaultyRedis, RedisClock, client_of, store_on, use
from tests.support.helpers import wait_for
from tests.support.ledger import US, Driver, Key, dt, us
from tests.support.pumps import kill_mid_batch, pumps

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_workers")]

GRACE = 5 * US  # DEBOUNCE_DISPATCH_GRACE
DIRECT = US  # DEBOUNCE_PUMP_INTERVAL: a counter outlives its flight's due time by 3 of them
PREFIX = "debounce-fault"
TASK = "testapp.fault"  # task i of an example is TASK + str(i), with two keys
HOUR = 3600 * US
CLOCK = [1000, US // 2, US, 2 * US, 4 * US, 7 * US]
KEYS = int(os.environ.get("DEBOUNCE_FAULT_KEYS", "800"))

SETTINGS = settings(
    max_examples=int(os.environ.get("DEBOUNCE_FAULT_EXAMPLES", "40")),
    stateful_step_count=int(os.environ.get("DEBOUNCE_FAULT_STEPS", "40")),
    deadline=None,
    derandomize=os.environ.get("DEBOUNCE_FAULT_RANDOM") != "1",
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate]
    + ([Phase.shrink] if os.environ.get("DEBOUNCE_PROPERTY_SHRINK", "1") == "1" else []),
)


def clean() -> None:
    DebounceRun.objects.all().delete()
    DebounceDue.objects.all().delete()
    DebounceKey.objects.all().delete()


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyRedis]:
    redis = FaultyRedis(Path(tmp_path_factory.mktemp("fault-redis")))
    try:
        yield redis
    finally:
        redis.close()


@pytest.fixture
def redis(faulty: FaultyRedis) -> Iterator[FaultyRedis]:
    """The test's own Redis, healed and empty, and the Redis store's settings on it."""
    faulty.reset()
    with override_settings(
        DEBOUNCE_BACKEND="redis",
        DEBOUNCE_REDIS_URL=faulty.url,
        DEBOUNCE_REDIS_PREFIX=PREFIX,
        DEBOUNCE_DISPATCH_GRACE=GRACE / US,
        DEBOUNCE_PUMP_INTERVAL=DIRECT / US,
    ):
        yield faulty
    faulty.reset()


def driver_on(redis: FaultyRedis, *, offset: int = 0, cls: type = RedisBackend) -> Driver:
    """A fake-clock driver of a Redis store on ``redis`` whose scripts run in the fake clock
    plus ``offset``."""
    holder: dict[str, Driver] = {}
    clock = RedisClock(lambda: holder["d"].now, offset)
    backend = store_on(redis.client(), clock, cls)
    d = Driver(
        backend,
        broken=lambda: redis.state != "up",
        counters=lambda name: None if redis.state == "down" else redis.admin.hgetall(name),
        redis_offset=offset,
    )
    d.clock = clock  # type: ignore[attr-defined]
    holder["d"] = d
    return d


def row(key: Key) -> dict[str, Any]:
    return DebounceKey.objects.filter(key_hash=key.hash).values().get()


def merged(result: Any) -> bool:
    """Whether a trigger was absorbed by a Redis counter (the row did not see it)."""
    return result.pending > 0 and result.due_at is None


# -- 1, 3 and 6: random steps with faults at any of them -------------------------------------


@st.composite
def task_options(draw: Any) -> FlightOptions:
    wait = draw(st.sampled_from([0.0, 0.5, 2.0]))
    leading = draw(st.booleans())
    return FlightOptions(
        wait=wait,
        max_wait=draw(st.sampled_from([None, wait, wait + 1.5])),
        leading=leading,
        trailing=draw(st.booleans()) if leading else True,
        overlap=draw(st.booleans()),
        lease=draw(st.sampled_from([1.0, 3.0, 10.0])),
    )


class FaultMachine(RuleBasedStateMachine):
    """Random steps on the Redis store, and faults of its Redis between any two of them."""

    redis: FaultyRedis
    offset = 0

    def __init__(self) -> None:
        super().__init__()
        clean()
        self.redis.reset()
        self.d = driver_on(self.redis, offset=self.offset)
        self.primary = self.d.backend.client
        self.keys: list[Key] = []

    @initialize(tasks=st.lists(task_options(), min_size=1, max_size=2))
    def setup(self, tasks: list[FlightOptions]) -> None:
        for i, opts in enumerate(tasks):
            for j in range(2):
                self.keys.append(self.d.add_key(f"{TASK}{i}", f"fault-{i}-{j}", opts))

    def key(self, k: int) -> Key:
        return self.keys[k % len(self.keys)]

    # -- the callers ---------------------------------------------------------------------

    @rule(
        k=st.integers(0, 3),
        value=st.sampled_from([1, 1, 2]),
        own=call_options(plain=3, given=2),
        fails=st.booleans(),
    )
    def trigger(self, k: int, value: int, own: dict[str, float], fails: bool) -> None:
        self.d.trigger(self.key(k), value, own=own, fails=fails)

    @rule(
        t=st.integers(0, 1),
        picks=st.lists(
            st.tuples(st.integers(0, 1), st.sampled_from([1, 1, 2])), min_size=1, max_size=4
        ),
    )
    def trigger_many(self, t: int, picks: list[tuple[int, int]]) -> None:
        tasks = sorted({k.task for k in self.keys})
        task = tasks[t % len(tasks)]
        mine = [k for k in self.keys if k.task == task]
        self.d.trigger_many([(mine[j % len(mine)], v) for j, v in picks])

    @rule(step=st.sampled_from(CLOCK))
    def clock(self, step: int) -> None:
        self.d.now += step

    @rule(
        k=st.integers(0, 3),
        what=st.sampled_from(["due_at", "counter_until", "running_until"]),
        delta=st.sampled_from([-1, 0, 1]),
    )
    def jump(self, k: int, what: str, delta: int) -> None:
        """The clock to a boundary of a key's row: its due time, its counter's fence, its
        lease end (give or take 1 us)."""
        found = DebounceKey.objects.filter(key_hash=self.key(k).hash).values_list(what, flat=True)
        target = to_us(next(iter(found), None))
        if target is not None and target + delta > self.d.now:
            self.d.now = target + delta

    @rule(fails=st.booleans())
    def take(self, fails: bool) -> None:
        self.d.take(fails=fails)

    @precondition(lambda self: self.d.pool)
    @rule(i=st.integers(0, 20), on_time=st.booleans())
    def deliver(self, i: int, on_time: bool) -> None:
        self.d.deliver(i, on_time=on_time)

    @precondition(lambda self: self.d.pool)
    @rule(i=st.integers(0, 20))
    def lose_message(self, i: int) -> None:
        self.d.pool.pop(i % len(self.d.pool))

    @rule(k=st.integers(0, 3))
    def run_due(self, k: int) -> None:
        self.d.run_due(self.key(k))

    @precondition(lambda self: self.d.running)
    @rule(i=st.integers(0, 20), retry=st.sampled_from([None, None, 0.0, 2.0]))
    def finish(self, i: int, retry: float | None) -> None:
        self.d.finish(i, ok=retry is None, retry_in=retry)

    @precondition(lambda self: self.d.running)
    @rule(i=st.integers(0, 20))
    def extend(self, i: int) -> None:
        self.d.extend(i)

    @precondition(lambda self: self.d.running)
    @rule(i=st.integers(0, 20))
    def crash(self, i: int) -> None:
        self.d.crash(i)

    @rule(k=st.integers(0, 3))
    def flush(self, k: int) -> None:
        self.d.flush(self.key(k))

    @rule(k=st.integers(0, 3))
    def cancel(self, k: int) -> None:
        self.d.cancel(self.key(k))

    # -- the faults ----------------------------------------------------------------------

    @precondition(lambda self: self.redis.state != "down")
    @rule(k=st.integers(0, 3))
    def forget(self, k: int) -> None:
        """Redis forgets one key: the counter, or the tombstone, of a key."""
        key = self.key(k)
        self.d.note(f"forget {key.name}")
        self.redis.admin.delete(self.d.backend.counter_key(key.hash))

    @rule(kind=st.sampled_from(["down", "oom", "readonly", "flushall", "heal", "heal"]))
    def fault(self, kind: str) -> None:
        state = self.redis.state
        if kind == "heal":
            if state == "up":
                return
            self.d.note(f"heal from {state}")
            self.redis.heal()
            use(self.d.backend, self.primary, self.d.clock)  # type: ignore[attr-defined]
            return
        if state != "up":
            return
        self.d.note(kind)
        if kind == "down":
            self.redis.stop()
        elif kind == "oom":
            self.redis.out_of_memory()
        elif kind == "readonly":
            use(self.d.backend, self.redis.replica_client(), self.d.clock)  # type: ignore[attr-defined]
        else:
            self.redis.admin.flushall()

    # -- checks --------------------------------------------------------------------------

    @invariant()
    def holds(self) -> None:
        if self.keys:
            self.d.check()

    def teardown(self) -> None:
        if not self.keys or sys.exc_info()[0] is not None:
            return
        self.fault("heal")
        self.d.drain()
        self.d.check_end()


def run_machine(redis: FaultyRedis, offset: int, examples: int | None = None) -> None:
    FaultMachine.redis = redis
    FaultMachine.offset = offset
    run_state_machine_as_test(
        FaultMachine,
        settings=SETTINGS if examples is None else settings(SETTINGS, max_examples=examples),
    )


def test_faults_at_any_step(redis: FaultyRedis) -> None:
    """Cases 1 and 3: a counter or a tombstone forgotten, Redis stopped (and restarted
    empty), out of memory, read-only or flushed, between any two steps."""
    run_machine(redis, 0)


@pytest.mark.parametrize("offset", [HOUR, -HOUR], ids=["redis-ahead", "redis-behind"])
def test_clocks_an_hour_apart(redis: FaultyRedis, offset: int) -> None:
    """Case 6: the same random steps, Redis's clock an hour off the database's."""
    run_machine(redis, offset, examples=max(SETTINGS.max_examples // 3, 5))


@pytest.mark.parametrize("offset", [0, HOUR, -HOUR])
def test_a_counter_dies_at_the_fence_in_either_clock(redis: FaultyRedis, offset: int) -> None:
    """Case 6 (fence 2): only durations cross between the clocks. The counter's expiry in
    Redis's clock is the row's ``counter_until`` moved by exactly the offset; a merge just
    before it is absorbed, one at it is refused and takes the row path."""
    d = driver_on(redis, offset=offset)
    key = d.add_key(TASK, "clocks", FlightOptions(wait=2.0, lease=10.0))
    counter_key = d.backend.counter_key(key.hash)
    assert not merged(d.trigger(key, 1))
    # a flight's first trigger makes no counter; its second (on the row path: nothing to
    # merge into) joins the flight and makes it
    assert row(key)["counter_until"] is None and not redis.admin.exists(counter_key)
    assert not merged(d.trigger(key, 1))
    until = to_us(row(key)["counter_until"])
    assert until is not None
    counter = redis.admin.hgetall(counter_key)
    assert int(counter[b"x"]) == until + offset
    assert until == to_us(row(key)["due_at"]) + 3 * DIRECT
    # merges move the flight's due time (folded at the claim), so the fence moves with
    # each row-path trigger only; the counter made now dies at `until`
    d.now = until - 1
    assert merged(d.trigger(key, 1))
    d.now = until
    assert not merged(d.trigger(key, 1)), "a merge at the counter's expiry was absorbed"
    d.check()
    d.drain()
    d.check_end()


# -- 2: Redis restarted empty or flushed with flights pending --------------------------------


@pytest.mark.parametrize("how", ["restart", "flushall"])
def test_redis_loses_everything_with_flights_pending(redis: FaultyRedis, how: str) -> None:
    """300 keys, each with a counter that absorbed triggers, a message out, or a live run
    and a new flight, when Redis restarts empty (or is flushed): every flight runs from the
    database's due index."""
    d = driver_on(redis)
    opts = FlightOptions(wait=2.0, lease=30.0)
    keys = [d.add_key(TASK, f"lost-{i}", opts) for i in range(300)]
    # the first trigger of each flight makes no counter, the second makes it
    for _ in range(2):
        d.now += US // 10
        assert not any(merged(r) for r in d.trigger_many([(k, 1) for k in keys]))
    assert not d.backend.counted([k.hash for k in keys])
    for _ in range(2):
        d.now += US // 10
        assert all(merged(r) for r in d.trigger_many([(k, 1) for k in keys]))
    assert sum(d.backend.counted([k.hash for k in keys]).values()) == 600
    d.now += 3 * US
    d.take()
    assert len(d.pool) == 300
    for _ in range(150):  # half of them claimed and running, half with their message out
        d.deliver(0)
    assert len(d.running) == 150
    every = {k.hash for k in keys}
    running = {r.key for r in d.running}
    # new flights behind the live runs (their first trigger makes no counter, the second
    # makes one, the third merges); the others' flights, their counters sealed by the take,
    # get a counter of the new payload at once and merge from the second trigger on
    for expected in (set(), every - running, every):
        d.now += US // 10
        results = d.trigger_many([(k, 2) for k in keys])
        assert {k.hash for k, r in zip(keys, results, strict=True) if merged(r)} == expected
    assert sum(d.backend.counted([k.hash for k in keys]).values()) == 150 * 2 + 150
    d.check()
    if how == "restart":
        redis.stop()
        redis.start()
    else:
        redis.admin.flushall()
    assert redis.admin.dbsize() == 0
    d.now += US // 10
    results = d.trigger_many([(k, 2) for k in keys])
    assert not any(merged(r) for r in results), "a trigger merged into a counter Redis lost"
    d.check()
    d.drain()
    d.check_end()
    runs = DebounceRun.objects.filter(debounce_key__key_hash__in=[k.hash for k in keys])
    # the running half ran twice (their new flights after), the others' messages took all
    assert runs.filter(outcome=DebounceRun.Outcome.SUCCESS).count() == 150 * 2 + 150


# -- 3: Redis refusing or unreachable --------------------------------------------------------


def test_out_of_memory(redis: FaultyRedis) -> None:
    """Under ``noeviction`` with ``maxmemory 1``: triggers take the row path; seal
    (``allow-oom``) still seals, so a claim is due at the flight's own due time (not at
    ``counter_until``) and folds what the counter counted; cancel works."""
    d = driver_on(redis)
    opts = FlightOptions(wait=2.0, lease=10.0)
    key, fresh, other, held = (
        d.add_key(TASK, name, opts) for name in ("oom", "oom-new", "oom-x", "oom-held")
    )
    for k in (key, other, held):
        assert not merged(d.trigger(k, 1))
        assert not merged(d.trigger(k, 1))  # the flight's second trigger makes its counter
        assert merged(d.trigger(k, 1))
    redis.out_of_memory()
    assert not merged(d.trigger(key, 1)), "a trigger merged while Redis refused writes"
    assert not merged(d.trigger(fresh, 1))
    assert d.cancel(other) == 3, "cancel under OOM: seal runs there"
    assert row(held)["counter_until"] is not None
    assert row(held)["pending"] == 2  # its third trigger is in the counter, not the row
    d.now = max(to_us(row(k)["due_at"]) for k in (key, fresh, held)) + US // 10  # type: ignore[type-var]
    assert to_us(row(held)["counter_until"]) > d.now  # type: ignore[operator]
    taken = d.take()
    assert {x.key_hash for x in taken.dispatches} == {key.hash, fresh.hash, held.hash}, (
        "a take under OOM waited for the fence: seal did not run"
    )
    claims = {}
    while d.pool:
        decision = d.deliver(0)
        claims[decision.claim.key_hash] = decision.claim
    assert claims[key.hash].triggers == 4  # the row's 3 and the counter's 1, folded
    assert claims[held.hash].triggers == 3  # the counter's 1 folded by the take's seal, under OOM
    while d.running:
        d.finish(0)
    d.check()
    redis.heal()
    d.drain()
    d.check_end()


def test_no_counter_is_made_out_of_memory(redis: FaultyRedis) -> None:
    """The fault table: "Redis refusing (OOM, READONLY) at trigger: the row path; no counter
    is made". A trigger that opens a flight under ``maxmemory 1``/``noeviction``."""
    d = driver_on(redis)
    key = d.add_key(TASK, "oom-open", FlightOptions(wait=2.0, lease=10.0))
    redis.out_of_memory()
    used = int(redis.admin.info("memory")["used_memory"])
    assert not merged(d.trigger(key, 1))
    counter = redis.admin.hgetall(d.backend.counter_key(key.hash))
    assert not counter, (
        f"open.lua made a counter while Redis refused writes ({counter}; used memory {used} "
        "> maxmemory 1): its DEL before HSET marks the script as having written, and Redis "
        "then lets its denied-under-OOM HSET through"
    )
    redis.heal()
    d.drain()
    d.check_end()


@pytest.mark.parametrize("how", ["readonly", "down"])
def test_claims_wait_for_the_fence(redis: FaultyRedis, how: str) -> None:
    """Redis read-only (the store's client on a replica) or stopped: triggers take the row
    path; a take, a claim and a flush's message wait for ``counter_until`` (no claim before
    it; cancel refuses with ``StoreUnavailable``, changing nothing), then go on without the
    counter; a finish never needs Redis."""
    d = driver_on(redis)
    opts = FlightOptions(wait=2.0, lease=10.0)
    key, running, flushed = (d.add_key(TASK, f"{how}-{i}", opts) for i in range(3))
    for k in (key, running, flushed):
        assert not merged(d.trigger(k, 1))
        assert not merged(d.trigger(k, 1))  # the flight's second trigger makes its counter
        assert merged(d.trigger(k, 1))
    d.now = to_us(row(running)["due_at"]) + US // 10  # past what the merge moved it to
    assert d.run_due(running).action == FireAction.CLAIM  # sealed while Redis is healthy
    # a new flight behind the live run: its second trigger makes its counter
    assert not merged(d.trigger(running, 1))
    assert row(running)["counter_until"] is None
    assert not merged(d.trigger(running, 1))
    if how == "down":
        redis.stop()
    else:
        use(d.backend, redis.replica_client(), d.clock)  # type: ignore[attr-defined]
    assert not merged(d.trigger(key, 1)), "merged into a Redis that cannot take it"
    fences = {k.hash: to_us(row(k)["counter_until"]) for k in (key, flushed, running)}
    assert all(until > d.now for until in fences.values())  # type: ignore[operator]
    assert d.cancel(key) is None, "cancel went on without sealing the counter"
    d.flush(flushed)
    # the pump, the messages (early) and in-process claims before the fences: no claim
    d.now = to_us(row(key)["due_at"])
    d.take()
    for _ in range(len(d.pool)):
        d.deliver(0, on_time=False)
    d.run_due(key)
    d.run_due(flushed)
    d.finish(0)  # the run of `running`: a finish never needs Redis
    runs = DebounceRun.objects.filter(debounce_key__key_hash__in=[key.hash, flushed.hash])
    assert not runs.exists(), f"claimed before the counter's fence; {d.where()}"
    assert DebounceRun.objects.filter(outcome=DebounceRun.Outcome.SUCCESS).count() == 1
    # past the fences every step goes on without Redis
    d.now = max(fences.values())  # type: ignore[type-var]
    assert d.cancel(running) == 2, "cancel past the fence did not go on"
    d.drain()
    d.check_end()
    for run in runs:
        assert us(run.started_at) >= fences[run.debounce_key.key_hash], "claimed before the fence"
    assert runs.count() == 2
    redis.heal()
    use(d.backend, redis.client(), d.clock)  # type: ignore[attr-defined]
    assert not merged(d.trigger(key, 1))
    d.drain()
    d.check_end()


# -- 4: Redis full under allkeys-lru ---------------------------------------------------------


def test_evicting_redis_with_many_keys_pending(redis: FaultyRedis, tmp_path: Path) -> None:
    """``allkeys-lru`` with room for about half of the counters of ``KEYS`` pending keys:
    Redis evicts counters (some that absorbed triggers) and tombstones while triggers,
    takes and claims run. A Redis of its own (no replica's buffers in its memory)."""
    redis = FaultyRedis(tmp_path)
    try:
        with override_settings(DEBOUNCE_REDIS_URL=redis.url):
            evicting(redis)
    finally:
        redis.close()


def evicting(redis: FaultyRedis) -> None:
    d = driver_on(redis)
    opts = FlightOptions(wait=2.0, lease=60.0)
    keys = [d.add_key(TASK, f"lru-{i}", opts) for i in range(KEYS)]
    for _ in range(2):  # a counter each, made by each flight's second trigger
        assert not any(merged(r) for r in d.trigger_many([(k, 1) for k in keys]))
        d.now += 1000
    assert redis.admin.exists(*(d.backend.counter_key(k.hash) for k in keys)) == KEYS
    d.check()
    size = int(redis.admin.memory_usage(d.backend.counter_key(keys[0].hash)) or 0)
    redis.evicting(room=-(size * KEYS) // 2)  # room for about half of the counters
    rng = random.Random(22)  # each round in its own order: some counters are still there
    counted = []
    for _round in range(3):
        absorbed = 0
        order = rng.sample(keys, len(keys))
        for i in range(0, KEYS, 200):
            results = d.trigger_many([(k, 1) for k in order[i : i + 200]])
            absorbed += sum(merged(r) for r in results)
            d.now += 1000
        counted.append(absorbed)
    assert redis.evicted() > 0, "nothing was evicted: the test tests nothing"
    assert max(counted) > 0, f"no counter absorbed a trigger ({counted}): the test tests nothing"
    left = sum(d.backend.counted([k.hash for k in keys]).values())
    assert left < sum(counted), "no counter that absorbed triggers was evicted"
    d.now += 3 * US
    d.check()
    d.drain()
    d.check_end()
    assert redis.evicted() > 0


# -- 5: Redis paused longer than a counter's life (real clocks) ------------------------------


def db_now() -> int:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT clock_timestamp()")
            value = cursor.fetchone()[0]
            return to_us(value if value.tzinfo else value.replace(tzinfo=UTC))  # type: ignore[return-value]
    return int(datetime.now(UTC).timestamp() * US)


class HeldOpens(RedisBackend):
    """A Redis store whose process pauses between a row-path trigger's commit and the
    ``open`` of its counter: ``after_commit`` keeps the records until the test runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = False
        self.held: list[Any] = []

    def after_commit(self, records: Any) -> None:
        if not self.holding:
            return super().after_commit(records)
        self.held.extend(r for r in records if "open" in r.extra)


def test_redis_paused_longer_than_a_counter_life(redis: FaultyRedis) -> None:
    """SIGSTOP for longer than a counter lives (pump interval 0.5 s: due + 1.5 s): calls
    time out (socket timeout 0.3 s) and take the row path or wait; a claim waits for
    ``counter_until``; the merge and the open the paused Redis runs when it resumes, after
    the counter's expiry, are refused."""
    interval = 0.5
    with override_settings(DEBOUNCE_PUMP_INTERVAL=interval):
        backend = store_on(redis.client(timeout=0.3), cls=HeldOpens)
        d = Driver(backend, fake=False, broken=lambda: redis.state != "up")
        opts = FlightOptions(wait=0.5, lease=30.0)
        key, late, opener = (d.add_key(TASK, f"paused-{i}", opts) for i in range(3))
        for k in (key, late):
            assert not merged(d.trigger(k, 1))
            assert not merged(d.trigger(k, 1))  # the flight's second trigger makes its counter
            assert merged(d.trigger(k, 1))
        # `opener`: a row-path trigger (its flight's second, so it makes a counter) whose
        # process pauses before its open
        assert not merged(d.trigger(opener, 1))
        backend.holding = True
        assert not merged(d.trigger(opener, 1))
        backend.holding = False
        (held,) = backend.held
        assert not redis.admin.exists(backend.counter_key(opener.hash))
        x_late = int(redis.admin.hget(backend.counter_key(late.hash), "x"))
        redis.pause()
        # a trigger: its merge times out, it takes the row path
        assert not merged(d.trigger(key, 1))
        assert row(key)["pending"] == 3  # the row's 2 and this one; the counter's 1 unsealed
        # the claim of `key` at its due time waits for the fence
        due = to_us(row(key)["due_at"])
        wait_for(lambda: db_now() >= due, message="the flight's due time")
        decision = d.run_due(key)
        assert decision.action != FireAction.CLAIM, "claimed while the counter could not seal"
        until = to_us(row(key)["counter_until"])
        assert to_us(row(key)["due_at"]) == until
        # another process's merge of `late`, and the open of `opener`, sent now by clients
        # that wait for the answer: the paused Redis runs them when it resumes
        fp = fingerprint(dumps(d.payload(1)), opts)
        opening = [*held.extra.pop("open")][:5]  # Redis's TIME decides, as in production
        x_open = opening[2]
        with ThreadPoolExecutor(2) as threads:
            late_merge = threads.submit(
                backend.scripts["merge"],
                keys=[backend.counter_key(late.hash)],
                args=[fp, "", "mlate", 1],
                client=client_of(redis.url, timeout=60),
            )
            late_open = threads.submit(
                backend.scripts["open"],
                keys=[backend.counter_key(opener.hash)],
                args=[*opening, ""],
                client=client_of(redis.url, timeout=60),
            )
            # paused past every counter's expiry (Redis's clock is this host's)
            x_last = max(x_late, x_open)
            wait_for(
                lambda: time.time() * US > x_last + 200_000 and db_now() > until,  # type: ignore[operator]
                timeout=30,
                message="the counters' life to pass",
            )
            assert not late_merge.done() and not late_open.done()
            redis.resume()
            merge_reply = late_merge.result(timeout=30)
            open_reply = late_open.result(timeout=30)
        assert merge_reply[0] == 0, f"a merge run after the counter's expiry: {merge_reply}"
        assert open_reply == 0, "an open run after the counter's expiry made a counter"
        counter = redis.admin.hgetall(backend.counter_key(late.hash))
        assert counter.get(b"n") in (b"1", None), f"a late merge was absorbed: {counter}"
        opened = redis.admin.hgetall(backend.counter_key(opener.hash))
        assert not opened or b"s" in opened, f"a late open made a counter: {opened}"
        d.check()
        d.drain()
        d.check_end()


# -- 7: a triggering process paused between its row write and its Redis write ----------------


@pytest.mark.parametrize("fence", ["tombstone", "expiry"])
def test_a_late_open_is_refused(redis: FaultyRedis, fence: str) -> None:
    """The open of a trigger's counter runs after a claim took its flight: it finds the
    claim's tombstone, or (the tombstone forgotten) its expiry passed; the next trigger of
    the same payload takes the row path, and nothing is lost."""
    d = driver_on(redis, cls=HeldOpens)
    backend = d.backend
    key = d.add_key(TASK, f"late-open-{fence}", FlightOptions(wait=2.0, lease=30.0))
    assert not merged(d.trigger(key, 1))  # the flight's first trigger makes no counter
    backend.holding = True
    assert not merged(d.trigger(key, 1))  # its second makes one: its open is held
    backend.holding = False
    held = list(backend.held)
    assert len(held) == 1 and d.clock.calls["open"] == 0  # type: ignore[attr-defined]
    counter_key = backend.counter_key(key.hash)
    assert not redis.admin.exists(counter_key)
    d.now = to_us(row(key)["due_at"])
    d.take()
    assert d.deliver(0).action == FireAction.CLAIM
    assert redis.admin.hget(counter_key, "s") == b"1", "the claim left no tombstone"
    if fence == "expiry":
        redis.admin.delete(counter_key)
        d.now = held[0].extra["open"][2] + 1  # past the counter's expiry x
    RedisBackend.after_commit(backend, held)  # the paused process wakes up
    assert d.clock.calls["open"] == 1  # type: ignore[attr-defined]
    counter = redis.admin.hgetall(counter_key)
    assert not counter or b"s" in counter, f"the late open made a counter: {counter}"
    assert not merged(d.trigger(key, 1)), "a trigger merged into a late-opened counter"
    d.check()
    d.drain()
    d.check_end()


# -- 8: a pump killed mid-batch; three pumps on one store ------------------------------------


def test_pumps_killed_and_racing(redis: FaultyRedis) -> None:
    """300 due keys with counters. A pump is SIGKILLed inside its take (rows locked,
    counters sealed, nothing committed): its batch rolls back. Then three pumps take the
    same entries at once: every key is taken by exactly one of them, once, and every flight
    runs."""
    with override_settings(DEBOUNCE_REDIS_PREFIX="debounce", DEBOUNCE_DISPATCH_GRACE=60):
        d = driver_on(redis)
        opts = FlightOptions(wait=3.0, lease=60.0)  # flights wait in the due index
        keys = [d.add_key(TASK, f"pump-{i}", opts) for i in range(300)]
        for _ in range(2):  # each flight's second trigger makes its counter
            assert not any(merged(r) for r in d.trigger_many([(k, 1) for k in keys]))
            d.now += US // 10
        assert all(merged(r) for r in d.trigger_many([(k, 1) for k in keys]))
        d.now += 4 * US
        assert not d.pool
        fields = {
            TASK: {"wait": opts.wait, "lease": opts.lease, "max_wait": None, "overlap": False}
        }
        batch = kill_mid_batch(redis.url, fields, limit=100, now_us=d.now)
        assert len(batch) == 100
        assert DebounceDue.objects.filter(due_at__gt=dt(d.now)).count() == 0, (
            "the killed pump's batch was committed"
        )
        d.check()
        results = pumps(redis.url, fields, processes=3, limit=40, now_us=d.now)
        assert [errors for _t, errors in results] == [[], [], []]
        taken = [item for got, _e in results for item in got]
        assert sorted(h for h, _s in taken) == sorted(k.hash for k in keys), (
            "a key taken twice, or not at all"
        )
        d.now += 1
        for hashed, seq in taken:
            d.publish(d.keys[hashed], Dispatch(hashed, seq, 0.0, TASK), dt(d.now))
        d.check()
        d.drain()
        d.check_end()
        claims = DebounceRun.objects.filter(debounce_key__key_hash__in=[k.hash for k in keys])
        assert claims.count() == 300
        # the counts the killed pump sealed were read again from their tombstones
        assert set(claims.values_list("triggers", flat=True)) == {3}
