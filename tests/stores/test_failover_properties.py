"""Property test of the ``auto`` store while Redis fails and comes back (docs/design.md,
"Failover of the auto store"; issue 12.8).

Hypothesis draws the options of three keys, each of a task of its own (wait, max_wait,
leading, trailing, overlap, lease), and a list of steps that drive the ``auto`` store directly
(no worker): triggers, steps of a fake clock, the pump's takes (some publishes refused and
released), the worker's deliveries (claims, on time or early), finishes (ok, or a failure to
retry), the lease keeper's extensions, crashed runs, flushes, cancels, the recorder draining
the records of the Redis store, the pump's recheck of the durable records, and faults of a
``redis-server`` the test runs itself:

- ``down``: the server is killed (connections refused); ``back``: it starts again, with every
  write it answered (it runs with ``appendonly yes``, ``appendfsync always``) or empty (the
  append-only file deleted first: a restart that lost everything);
- ``oom``: ``CONFIG SET maxmemory 1`` with ``maxmemory-policy noeviction``, so every script
  that writes first gets an ``OOM`` error reply, and back to no limit;
- ``flushall``: Redis loses everything while it answers (records not yet drained included);
  ``evict``: one key's hash is deleted (its index entry stays).

The failover rules are a state machine of their own (which store holds a key, a database
flight that takes a row over, durable records, rechecks), so instead of a model this test
keeps a ledger of what the store answered, and checks what docs/design.md promises, no more:

- I8 and the failover: a trigger never raises while the database answers, whatever Redis
  does, and goes to the database store only while Redis fails;
- I1 at least once: every accepted trigger (``trigger()`` returned) is covered by a run
  claimed after it whose body completed, once Redis is healthy again and everything due has
  been drained (the end of each example heals Redis and plays the pump, the recorder, the
  recheck and the worker until both stores are idle); duplicates are allowed;
- I2: with ``overlap=False``, two runs of one key never execute at once in one store, except
  a run whose Redis state was lost while it executed (its flight is rebuilt from the durable
  record and runs again: at least once); a run of each store may overlap only for a key
  whose trigger the database store took ("while both stores hold a flight for one key");
- a claim covers at least one and at most the accepted triggers of its key; while the key's
  Redis state was never lost, at most those its store accepted that no completed run of that
  store covers yet; its payload is one that an accepted trigger of the key gave;
- the durable record: after healing, every ``DebounceKey`` row of the test's keys is idle
  with nothing pending ("no pending record outlives its flight"), and both stores are idle.

Every store call gets ``now=`` from a fake clock (as in tests/stores/test_properties.py) and
``auto.RETRY_AFTER`` is 0 (each step tries Redis again), so a failing list of steps replays
exactly (``play()``; the regression tests at the end are such lists). Deterministic in the
normal suite (``derandomize``, a bounded number of examples). A long randomised run::

    DEBOUNCE_FAILOVER_RANDOM=1 DEBOUNCE_FAILOVER_EXAMPLES=2000 scripts/test \\
        tests/stores/test_failover_properties.py -k under_redis_faults --hypothesis-seed=1234

(``DEBOUNCE_FAILOVER_STEPS``: the most steps per example; ``DEBOUNCE_PROPERTY_SHRINK=0``:
report the first failure unshrunk.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import override_settings
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from django_debounce.backends import auto, get_backend
from django_debounce.backends.base import LiveRun
from django_debounce.backends.errors import redis_unavailable
from django_debounce.keys import dumps, key_hash
from django_debounce.models import DebounceDue, DebounceKey, DebounceRun
from django_debounce.recorder import drain as drain_records
from django_debounce.state import Dispatch, Finish, FireAction, FlightOptions
from tests.support.private_tasks import private_task
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_workers")]

US = 1_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
START = int(datetime(2030, 1, 1, tzinfo=UTC).timestamp()) * US
GRACE = 5 * US  # DEBOUNCE_DISPATCH_GRACE during this test
DIRECT = US  # DEBOUNCE_PUMP_INTERVAL during this test
TASK = "testapp.failover_prop"  # key i belongs to task TASK + str(i)
KEYS = 3
CLOCK = [1000, US // 2, US, 2 * US, 4 * US, 7 * US, 15 * US]

# The kinds of step, each as often as it appears here. Hypothesis shrinks a step towards the
# first, ``skip`` (a step that does nothing), so a shrunk example keeps its length (lists are
# long: at least ``MIN_STEPS``) but shows only the steps that matter.
KINDS = (
    ["skip"]
    + ["trigger"] * 6
    + ["deliver"] * 4
    + ["many"] * 2
    + ["take", "finish", "clock"] * 3
    + ["record", "recheck", "back"] * 2
    + ["extend", "crash", "flush", "cancel", "down", "oom", "flushall", "evict"]
)
# A step: its kind and two small numbers whose meaning depends on the kind (``Player.step``).
Step = tuple[str, int, int]
MIN_STEPS = 12
STEPS = st.lists(
    st.tuples(st.sampled_from(KINDS), st.integers(0, 7), st.integers(0, 7)),
    min_size=MIN_STEPS,
    max_size=max(int(os.environ.get("DEBOUNCE_FAILOVER_STEPS", "48")), MIN_STEPS),
)

SETTINGS = settings(
    max_examples=int(os.environ.get("DEBOUNCE_FAILOVER_EXAMPLES", "60")),
    deadline=None,
    derandomize=os.environ.get("DEBOUNCE_FAILOVER_RANDOM") != "1",
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
def task_options(draw: Any) -> FlightOptions:
    wait = draw(st.sampled_from([0.0, 2.0]))
    leading = draw(st.booleans())
    return FlightOptions(
        wait=wait,
        max_wait=draw(st.sampled_from([None, wait + 3.0])),
        leading=leading,
        trailing=draw(st.booleans()) if leading else True,
        overlap=draw(st.booleans()),
        lease=draw(st.sampled_from([3.0, 10.0])),
    )


OPTIONS = st.lists(task_options(), min_size=KEYS, max_size=KEYS)
PLAIN = FlightOptions(wait=0.0, lease=3.0)  # the options of the regression examples' keys


# -- the ledger ------------------------------------------------------------------------------


@dataclass
class Trig:
    """One accepted trigger: when, which store took it (``"r"``/``"d"``), its payload."""

    at: int
    store: str
    payload: Any
    exempt: bool = False  # a cancel came after it: it need not run


@dataclass
class Run:
    """One claim the store handed out, and what became of its body."""

    store: str
    run_id: int
    claim_at: int
    lease_end: int
    triggers: int
    payload: Any
    seq: int | None
    losses: int  # the key's Redis state losses before the claim
    state: str = "live"  # live, done (the body completed), retried, crashed, killed
    recorded: bool = False  # its store took its finish (else its lease runs out: run again)

    def executing(self, now: int) -> bool:
        """The body still runs at ``now``: not ended, and its lease not run out (the lease
        keeper stops a run whose lease it could not renew)."""
        return self.state == "live" and now < self.lease_end


@dataclass
class Key:
    index: int
    name: str
    hash: str
    task: str
    options: FlightOptions
    trigs: list[Trig] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    dual: bool = False  # the database store took a trigger of it (both stores may hold one)
    losses: int = 0  # how many times its Redis state was lost (rebuilt flights run again)


@dataclass
class Message:
    key: int
    seq: int
    due: int
    store: str


class Player:
    """Plays a list of steps on the ``auto`` store of ``DEBOUNCE_REDIS_URL`` (``server``, the
    test's own redis-server) and keeps the ledger."""

    def __init__(self, server: RedisServer, options: Sequence[FlightOptions]) -> None:
        self.server = server
        if not server.running:
            server.start()
        self.admin = redis.Redis.from_url(server.url)
        self.admin.config_set("maxmemory", 0)
        self.admin.flushall()
        DebounceRun.objects.all().delete()
        DebounceKey.objects.all().delete()
        DebounceDue.objects.all().delete()
        self.backend = get_backend()
        assert isinstance(self.backend, auto.AutoBackend)
        assert self.backend.redis is not None and self.backend.redis.client.connection_pool
        self.now = START
        self.pool: list[Message] = []
        self.up = True
        self.oom = False
        self.log: list[str] = []  # the faults, for the failure messages
        self.stack = ExitStack()
        self.keys: list[Key] = []
        for i, opts in enumerate(options):
            name = f"{TASK}{i}"
            task = self.stack.enter_context(
                private_task(
                    name,
                    wait=opts.wait,
                    max_wait=opts.max_wait,
                    leading=opts.leading,
                    trailing=opts.trailing,
                    overlap=opts.overlap,
                    lease=opts.lease,
                )
            )
            assert task.flight_options() == opts, (task.flight_options(), opts)
            label = f"failover-{i}"
            self.keys.append(Key(i, label, key_hash(name, label), name, opts))

    def play(self, steps: Sequence[Step]) -> None:
        """Every step, then ``end()``."""
        try:
            for step in steps:
                self.step(*step)
            self.end()
        finally:
            self.stack.close()

    def end(self) -> None:
        """Heal Redis, drain everything and check the end."""
        self.heal()
        self.drain()
        self.check_end()

    def step(self, kind: str, a: int, b: int) -> None:
        if kind == "skip":
            pass
        elif kind == "trigger":
            self.trigger(a, b % 4, refused=b >= 6)
        elif kind == "many":
            self.trigger_many(a, [b % 4, (b + a) % 4])
        elif kind == "deliver":
            self.deliver(a, on_time=b % 2 == 0)
        elif kind == "take":
            self.take(refused=a >= 6)
        elif kind == "finish":
            self.finish(a, retry=b >= 6)
        elif kind == "clock":
            self.now += CLOCK[a % len(CLOCK)]
        elif kind == "record":
            self.record()
        elif kind == "recheck":
            self.recheck()
        elif kind == "extend":
            self.extend(a)
        elif kind == "crash":
            self.crash(a)
        elif kind == "flush":
            self.flush(a)
        elif kind == "cancel":
            self.cancel(a)
        elif kind == "down":
            self.down()
        elif kind == "back":
            self.back(keep=a % 4 != 0)
        elif kind == "oom":
            self.out_of_memory(on=a % 2 == 0)
        elif kind == "flushall":
            self.flushall()
        elif kind == "evict":
            self.evict(a)
        else:
            raise ValueError(f"unknown step {kind!r}")

    # -- plumbing ---------------------------------------------------------------------------

    def tick(self) -> int:
        now = self.now
        self.now += 1
        return now

    def key(self, k: int) -> Key:
        return self.keys[k % len(self.keys)]

    def live_runs(self) -> list[tuple[Key, Run]]:
        return [(key, run) for key in self.keys for run in key.runs if run.state == "live"]

    def publish(self, key: Key, dispatch: Dispatch | None, now: int) -> None:
        if dispatch is None:
            return
        assert dispatch.key_hash == key.hash and dispatch.store in ("r", "d"), dispatch
        self.pool.append(
            Message(key.index, dispatch.seq, now + round(dispatch.countdown * US), dispatch.store)
        )

    def unavailable(self, exc: BaseException) -> bool:
        """Whether an error of a store call is the test's own doing (Redis down, or out of
        memory): anything else is a bug, and fails the test."""
        return redis_unavailable(exc) and (not self.up or self.oom)

    def fault(self, what: str) -> None:
        self.log.append(f"{what} at {self.now - START}")

    # -- triggers -----------------------------------------------------------------------------

    def trigger(self, k: int, value: int, *, refused: bool = False) -> None:
        """A trigger: never raises while the database answers (I8); goes to the database
        store only while Redis fails; a message to publish at once is published, or refused
        by the broker and released."""
        key = self.key(k)
        now = self.tick()
        before = auto.stats.fallbacks
        payload = [value]
        result, dispatch = self.backend.trigger(
            task_name=key.task,
            key=key.name,
            key_hash=key.hash,
            payload_json=dumps(payload),
            options=key.options,
            now=dt(now),
        )
        store = "d" if auto.stats.fallbacks > before else "r"
        if store == "d":
            assert not self.up or self.oom, f"{key.name}: a trigger fell back, Redis healthy"
            key.dual = True
        if dispatch is not None:
            assert dispatch.store == store, (dispatch, store)
        if result.dropped:
            return  # trailing=False inside a leading run's window: counted as cancelled
        key.trigs.append(Trig(now, store, payload))
        if dispatch is not None and refused:
            self.release([dispatch])
        else:
            self.publish(key, dispatch, now)

    def trigger_many(self, k: int, values: list[int]) -> None:
        """``trigger_many`` of triggers of one key: through one Redis pipeline, the items
        that failed through the database store."""
        key = self.key(k)
        now = self.tick()
        before = auto.stats.fallbacks
        payloads = [[value] for value in values]
        out = self.backend.trigger_many(
            task_name=key.task,
            items=[(key.name, key.hash, dumps(p)) for p in payloads],
            options=key.options,
            now=dt(now),
        )
        fell_back = auto.stats.fallbacks > before
        if fell_back:
            assert not self.up or self.oom, f"{key.name}: triggers fell back, Redis healthy"
            key.dual = True
        for payload, (result, dispatch) in zip(payloads, out, strict=True):
            # which store took an item without a message is not told: "?" (either)
            store = dispatch.store if dispatch is not None else "?" if fell_back else "r"
            if not result.dropped:
                key.trigs.append(Trig(now, store, payload))
            self.publish(key, dispatch, now)

    def release(self, dispatches: list[Dispatch]) -> None:
        try:
            self.backend.release(dispatches, now=dt(self.tick()))
        except Exception as exc:  # the pump logs it: the flight is taken again later
            if not self.unavailable(exc):
                raise

    # -- the pump and the recorder ------------------------------------------------------------

    def take(self, *, refused: bool = False) -> None:
        """The pump takes every due entry of both stores (a Redis failure is its own: the
        database store's part goes on); the broker may refuse the publishes."""
        now = self.tick()
        tasks = {key.task: key.options for key in self.keys}
        taken = self.backend.take(tasks, 1000, now=dt(now))
        names = [(d.store, d.key_hash) for d in taken.dispatches]
        assert len(set(names)) == len(names), f"one flight taken twice: {taken}"
        if refused and taken.dispatches:
            self.release(taken.dispatches)
            return
        by_hash = {key.hash: key for key in self.keys}
        for dispatch in taken.dispatches:
            self.publish(by_hash[dispatch.key_hash], dispatch, now)

    def record(self) -> None:
        """The recorder drains the records of the Redis store into the durable rows."""
        try:
            while drain_records(self.backend.redis) >= 1000:
                pass
        except Exception as exc:
            if not self.unavailable(exc):
                raise

    def recheck(self) -> None:
        """The pump's recheck: overdue durable records compared with Redis, lost flights
        rebuilt (the auto store skips it while Redis fails)."""
        self.backend.recheck(now=dt(self.tick()))

    # -- the worker -----------------------------------------------------------------------------

    def deliver(self, i: int, *, on_time: bool = True) -> None:
        """A worker gets a message (now, or at its countdown); when its store cannot be
        reached, the worker delivers it again later (it stays in the pool)."""
        if not self.pool:
            return
        msg = self.pool.pop(i % len(self.pool))
        if on_time:
            self.now = max(self.now, msg.due)
        key = self.keys[msg.key]
        now = self.tick()
        try:
            decision = self.backend.fire(
                key.hash,
                msg.seq,
                task_name=key.task,
                options=key.options,
                now=dt(now),
                store=msg.store,
            )
        except Exception as exc:
            if not self.unavailable(exc):
                raise
            self.pool.append(msg)
            return
        if decision.dispatch is not None:
            assert decision.dispatch.store == msg.store
            self.publish(key, decision.dispatch, now)
        if decision.action is not FireAction.CLAIM:
            return
        claim = decision.claim
        assert claim is not None and claim.store == msg.store, (claim, msg)
        self.claimed(key, claim, now, msg.seq)

    def claimed(self, key: Key, claim: Any, now: int, seq: int | None) -> None:
        assert (claim.key_hash, claim.task_name) == (key.hash, key.task)
        assert us(claim.started_at) == now
        name = f"{key.name} run {claim.store}{claim.run_id} at {now - START}"
        # I2: no two runs of one key execute at once without overlap
        if not key.options.overlap:
            for run in key.runs:
                if not run.executing(now):
                    continue
                if run.store == claim.store == "r" and run.losses < key.losses:
                    continue  # its Redis state was lost: rebuilt, it runs again
                assert run.store != claim.store and key.dual, (
                    f"I2: {name} while run {run.store}{run.run_id} of {run.claim_at - START} "
                    f"executes (lease end {run.lease_end - START}); faults {self.log}"
                )
        # a claim covers at least one accepted trigger, never more than were accepted
        before = [t for t in key.trigs if t.at < now]
        assert 1 <= claim.triggers <= len(before), (
            f"{name} claims {claim.triggers} triggers of {len(before)} accepted"
        )
        if not key.losses:
            # each store claims the triggers it accepted: a run of each may cover one trigger
            # while both hold a flight of the key (at least once), never more
            mine = [
                t
                for t in before
                if t.store in (claim.store, "?")
                and not self.covered(key, t, claim.store, recorded=True)
            ]
            assert claim.triggers <= len(mine), (
                f"{name} claims {claim.triggers} triggers, {len(mine)} of its store are not "
                f"covered yet; faults {self.log}"
            )
        assert claim.payload in [t.payload for t in before], (
            f"{name}: payload {claim.payload!r} of no accepted trigger"
        )
        key.runs.append(
            Run(
                claim.store,
                claim.run_id,
                now,
                now + round(key.options.lease * US),
                claim.triggers,
                claim.payload,
                seq,
                key.losses,
            )
        )

    def covered(
        self, key: Key, trig: Trig, store: str | None = None, *, recorded: bool = False
    ) -> bool:
        """Whether a run (of ``store``; whose finish its store took) claimed after ``trig``
        completed."""
        return any(
            r.state == "done"
            and r.claim_at > trig.at
            and store in (None, r.store)
            and (r.recorded or not recorded)
            for r in key.runs
        )

    def finish(self, i: int, *, retry: bool = False) -> None:
        """A run's body returns (or fails, to be retried): the finish goes to the store that
        claimed it; when that store cannot be reached the finish is lost (the lease runs out
        and the flight runs again). A body whose lease ran out was stopped by the lease
        keeper: it never completed."""
        live = self.live_runs()
        if not live:
            return
        key, run = live[i % len(live)]
        now = self.tick()
        if now >= run.lease_end:
            run.state = "killed"
            return
        run.state = "retried" if retry else "done"
        end = Finish(
            ok=not retry,
            error="boom" if retry else "",
            retry_in=0.5 if retry else None,
            started_at=dt(run.claim_at),  # as the worker gives it (Claim.started_at)
        )
        try:
            follow = self.backend.finish(
                key.hash,
                run.run_id,
                end,
                task_name=key.task,
                options=key.options,
                now=dt(now),
                store=run.store,
            )
        except Exception as exc:
            if not self.unavailable(exc):
                raise
            return
        run.recorded = True
        if follow is not None:
            assert follow.store == run.store
            self.publish(key, follow, now)

    def extend(self, i: int) -> None:
        """The lease keeper extends the lease of a run its worker still executes."""
        live = [(k, r) for k, r in self.live_runs() if r.seq is not None]
        if not live:
            return
        key, run = live[i % len(live)]
        now = self.tick()
        if now >= run.lease_end:
            return
        assert run.seq is not None
        lease = LiveRun(key.hash, run.seq, key.options.lease, key.task, key.options, run.store)
        try:
            (got,) = self.backend.extend([lease], now=dt(now))
        except Exception as exc:
            if not self.unavailable(exc):
                raise
            return
        if got is not None:
            run.lease_end = now + round(got * US)

    def crash(self, i: int) -> None:
        """The worker running a run dies: its body never completes."""
        live = self.live_runs()
        if live:
            live[i % len(live)][1].state = "crashed"

    # -- operators ----------------------------------------------------------------------------

    def flush(self, k: int) -> None:
        key = self.key(k)
        now = self.tick()
        try:
            dispatch = self.backend.flush(
                key.hash, task_name=key.task, options=key.options, now=dt(now)
            )
        except Exception as exc:
            if not self.unavailable(exc):
                raise
            return
        self.publish(key, dispatch, now)

    def cancel(self, k: int) -> None:
        """Pending triggers are dropped: those accepted before need not run any more."""
        key = self.key(k)
        now = self.tick()
        self.backend.cancel(key.hash, task_name=key.task, options=key.options, now=dt(now))
        for trig in key.trigs:
            trig.exempt = True

    # -- faults -------------------------------------------------------------------------------

    def down(self) -> None:
        """Redis dies (SIGKILL): connections are refused."""
        if not self.up:
            return
        self.fault("down")
        self.server.stop()
        self.up = self.oom = False

    def back(self, *, keep: bool = True) -> None:
        """Redis starts again with every write it answered (the append-only file), or empty
        (a restart that lost its data)."""
        if self.up:
            return
        self.fault("back" if keep else "back empty")
        if not keep:
            self.server.wipe()
            for key in self.keys:
                key.losses += 1
        self.server.start()
        self.up = True

    def out_of_memory(self, *, on: bool = True) -> None:
        """Redis answers writes with ``OOM`` (``maxmemory`` far below what it uses, no
        eviction), or takes writes again."""
        if not self.up or self.oom == on:
            return
        self.fault("oom" if on else "oom off")
        self.admin.config_set("maxmemory-policy", "noeviction")
        self.admin.config_set("maxmemory", 1 if on else 0)
        self.oom = on

    def flushall(self) -> None:
        """Redis loses everything while it answers (records not yet drained included)."""
        if not self.up:
            return
        self.fault("flushall")
        self.admin.flushall()
        for key in self.keys:
            key.losses += 1

    def evict(self, k: int) -> None:
        """One key's Redis state is evicted (its index entry stays)."""
        if not self.up:
            return
        key = self.key(k)
        self.fault(f"evict {key.name}")
        state = self.backend.redis.state_key(key.hash)
        self.admin.delete(state, state + ":c", state + ":r")
        key.losses += 1

    # -- the end: heal, drain, check --------------------------------------------------------

    def heal(self) -> None:
        """Redis back for good, with its state, and writable."""
        if not self.up:
            self.server.start()
            self.up = True
        self.admin.config_set("maxmemory", 0)
        self.oom = False

    def settled(self) -> bool:
        tasks = [key.task for key in self.keys]
        if self.pool or any(run.executing(self.now) for _key, run in self.live_runs()):
            return False
        if DebounceDue.objects.filter(task_name__in=tasks).exists():
            return False
        return self.backend.redis.peek(tasks, now=dt(self.now)) is None

    def drain(self) -> None:
        """Run everything left as the pump, the recorder and the workers do with Redis
        healthy: finish the live runs, deliver messages on time, take due entries, record;
        when nothing is left, move the clock past every recheck time and recheck (a lost
        flight is rebuilt and run)."""
        for _round in range(300):
            for _key, run in self.live_runs():
                if run.executing(self.now):
                    self.finish(self.live_runs().index((_key, run)))
            self.record()
            if self.pool:
                self.deliver(min(range(len(self.pool)), key=lambda i: self.pool[i].due))
                continue
            self.take()
            if self.pool:
                continue
            if self.settled():
                self.now += 3600 * US
                self.record()
                self.recheck()
                if self.settled():
                    self.record()
                    return
                continue
            next_in = self.backend.peek([k.task for k in self.keys], now=dt(self.now))
            self.now += max(round((next_in or 0.0) * US), 1000)
        raise AssertionError(f"the keys did not become idle; faults {self.log}")

    def check_end(self) -> None:
        for key in self.keys:
            # I1 at least once: every accepted trigger ran, in a run claimed after it
            for trig in key.trigs:
                assert trig.exempt or self.covered(key, trig), (
                    f"I1: {key.name}: the trigger of {trig.at - START} ({trig.store}) never "
                    f"ran; runs {key.runs}; faults {self.log}"
                )
            # no pending record outlives its flight; both stores idle
            row = DebounceKey.objects.filter(key_hash=key.hash).first()
            if row is not None:
                assert (row.state, row.pending) == ("idle", 0), (
                    f"{key.name}: its record says {row.state}, {row.pending} pending, after "
                    f"healing ({row.store} store); faults {self.log}"
                )
            for store in (self.backend.redis, self.backend.database):
                live = store.live_state(key.hash)
                if live is None or (store is self.backend.database and row.store != "database"):
                    continue
                assert (live["state"], live["pending"]) == ("idle", 0), (
                    f"{key.name}: the {store.name} store says {live} after healing; "
                    f"faults {self.log}"
                )


# -- the tests ---------------------------------------------------------------------------------


@pytest.fixture
def failover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisServer]:
    """The ``auto`` store on a redis-server of this test's own (persistent: a restart keeps
    every answered write), trying Redis again at every step after a failure."""
    server = RedisServer(tmp_path, persistent=True)
    server.start()
    monkeypatch.setattr(auto, "RETRY_AFTER", 0.0)
    try:
        with override_settings(
            DEBOUNCE_BACKEND="auto",
            DEBOUNCE_REDIS_URL=server.url,
            DEBOUNCE_DISPATCH_GRACE=GRACE / US,
            DEBOUNCE_PUMP_INTERVAL=DIRECT / US,
            DEBOUNCE_REDIS_IDLE_TTL=3600,  # no idle hash expires (Redis's own clock) meanwhile
        ):
            yield server
    finally:
        server.stop()


def play(server: RedisServer, steps: Sequence[Step], options: Sequence[FlightOptions]) -> None:
    Player(server, options).play(steps)


def test_auto_store_under_redis_faults(failover: RedisServer) -> None:
    """Random lists of steps and faults (deterministic unless DEBOUNCE_FAILOVER_RANDOM=1)."""

    @SETTINGS
    @given(options=OPTIONS, steps=STEPS)
    def run(options: list[FlightOptions], steps: list[Step]) -> None:
        play(failover, steps, options)

    run()


# -- regression examples: failing lists of steps the test found, one per bug fixed -------------


def test_a_trigger_falls_back_on_an_oom_reply(failover: RedisServer) -> None:
    """redis-py raises ``OutOfMemoryError("command not allowed ...")`` for an ``OOM`` reply
    (the first word stripped): the auto store took it for a bug and the trigger raised."""
    play(failover, [("oom", 0, 0), ("trigger", 0, 0)], [PLAIN] * KEYS)


def test_a_seeded_record_is_not_overwritten_by_an_older_record(failover: RedisServer) -> None:
    """A trigger of a key new to Redis opened its durable record at the web host's clock,
    not Redis's (the clock of every record the recorder writes): a record of the key's
    earlier state (the cancel), written later, counted as newer and made the record idle, so
    when the key's Redis state was lost again nothing rebuilt its flight (I1)."""
    steps = [
        ("trigger", 1, 0),
        ("cancel", 1, 0),
        ("evict", 1, 0),
        ("trigger", 1, 0),
        ("evict", 1, 0),
    ]
    play(failover, steps, [PLAIN] * KEYS)


def test_the_recorder_keeps_a_flight_of_the_database_store(failover: RedisServer) -> None:
    """A run claimed on Redis; Redis goes down; a trigger falls back and the database store
    takes the key's row over with a flight of its own. Once Redis was back, the recorder
    wrote the Redis run's finish over that row (store "redis", nothing pending): the
    database store dropped its flight, whose trigger never ran (I1)."""
    steps = [("trigger", 0, 0), ("deliver", 0, 0), ("down", 0, 0), ("trigger", 0, 0)]
    play(failover, steps, [PLAIN] * KEYS)


def test_the_finish_of_a_run_before_a_lost_state_ends_only_that_run(
    failover: RedisServer,
) -> None:
    """Run 1 is claimed, Redis loses everything (its claim record too), a trigger rebuilds
    the flight from the durable record (which says run 0) and run 1 is claimed again. The
    first run 1 finishing ended the second one, whose worker then died: its trigger was never
    run again (I1). A finish now names its claim's start time too."""
    steps = [
        ("trigger", 0, 0),
        ("deliver", 0, 0),
        ("flushall", 0, 0),
        ("trigger", 0, 0),
        ("deliver", 0, 0),
        ("finish", 0, 0),
        ("crash", 0, 0),
    ]
    play(failover, steps, [PLAIN] * KEYS)


def test_a_trigger_new_to_redis_leaves_a_run_of_the_database_store(
    failover: RedisServer,
) -> None:
    """Redis answers OOM. A trigger of a key new to Redis opens its durable record (store
    "redis", record.seed) before its script fails; it falls back and the database store takes
    the row over with a flight of its own, which runs. The next such trigger opens the record
    again over the database store's live run (store "redis" again); its script fails too, so
    the database store takes the row over once more, drops the run it thinks is Redis's
    (``_Key.adopt``: its own, still executing) and claims a second run while the first
    executes (I2, within one store).

    Fixed by keeping a row the database store holds out of the Redis records (the seed and
    opening upserts skip it, the recorder leaves its state alone: docs/design.md, "Failover
    of the auto store"). What that left open, a Redis flight beside such a row, is the next
    tests."""
    steps = [
        ("oom", 0, 0),
        ("trigger", 1, 0),
        ("deliver", 0, 0),
        ("trigger", 1, 0),
        ("deliver", 0, 0),
    ]
    play(failover, steps, [PLAIN] * KEYS)


def test_a_redis_flight_beside_a_database_takeover_survives_a_lost_state(
    failover: RedisServer,
) -> None:
    """A trigger opens a flight on Redis; Redis goes down; a trigger falls back and the
    database store takes the row over (``_Key.adopt`` clears the record of the Redis flight)
    and runs its own flight. Redis comes back with its data, a trigger merges into the Redis
    flight (merged triggers never write the database), then Redis loses everything: nothing
    records the Redis flight any more (the row is the database store's, which the recheck does
    not look at), and that trigger, made after the database store's claim, never runs (I1).

    Fixed: the takeover remembers the live Redis flight on the row (``_Key.adopt``), and when
    the database store's flight ends the row goes back to Redis as a flight to recheck
    (``_Key.hand_back``): the recheck rebuilds it from the row and it runs."""
    steps = [
        ("trigger", 0, 0),
        ("down", 0, 0),
        ("trigger", 0, 0),
        ("deliver", 1, 0),
        ("back", 1, 0),
        ("trigger", 0, 0),
        ("flushall", 0, 0),
    ]
    play(failover, steps, [PLAIN] * KEYS)


def test_a_redis_flight_opened_beside_a_database_flight_survives_a_lost_state(
    failover: RedisServer,
) -> None:
    """A trigger falls back while Redis is down: the database store makes the row and holds
    a flight, whose run is claimed. Redis comes back and a trigger opens a flight of the key in
    Redis (the row is the database store's, so its record is not written). The database
    store's run finishes (the row idle), then Redis loses everything: without the row saying
    that Redis opened a flight beside it (``record.mark_beside``), nothing rebuilt that flight
    and the trigger never ran (I1)."""
    steps = [
        ("down", 0, 0),
        ("trigger", 0, 0),
        ("deliver", 0, 0),
        ("back", 1, 0),
        ("trigger", 0, 0),  # after the database store's claim: that run does not cover it
        ("finish", 0, 0),
        ("flushall", 0, 0),
    ]
    play(failover, steps, [PLAIN] * KEYS)


def test_an_idle_record_of_redis_clears_the_flight_beside(failover: RedisServer) -> None:
    """The database store took the row over from a live Redis flight (Redis was down). Once
    Redis is back that flight runs and finishes: the recorder's idle record of it says no
    Redis flight is left beside the database store's, so the row forgets it (``recheck_at``
    cleared) and is not handed back to Redis for a flight that already ran. The database
    store's own flight is untouched."""
    player = Player(failover, [PLAIN] * KEYS)
    key = player.keys[0]
    try:
        for step in [
            ("trigger", 0, 0),
            ("down", 0, 0),
            ("trigger", 0, 0),
            ("back", 1, 0),
            ("deliver", 0, 0),  # the Redis flight's message (the first one out)
        ]:
            player.step(*step)
        (run,) = key.runs
        assert run.store == "r", run
        row = DebounceKey.objects.get(key_hash=key.hash)
        assert (row.store, row.state) == ("database", "pending")
        assert row.recheck_at is not None  # the Redis flight beside it, since the takeover
        player.step("finish", 0, 0)
        player.step("record", 0, 0)
        row.refresh_from_db()
        assert (row.store, row.state, row.pending, row.recheck_at) == (
            "database",
            "pending",
            1,
            None,
        )
        player.end()
    finally:
        player.stack.close()


def test_a_batch_that_opened_a_redis_flight_before_a_refusal_keeps_the_mark(
    failover: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``trigger_many`` of two triggers of a key new to Redis: the first opens the flight in
    Redis and takes Redis past ``maxmemory``, the second is refused (``OOM``) and falls back.
    The refusal said "no Redis flight" for the key although the first item had opened one, so
    the database store's takeover did not mark it: a trigger merged into that flight after
    the database store's claim was lost with Redis's state (I1). A refused key counts as
    unopened only when Redis holds no state of it (``RedisBackend._absent``).

    How much one script writes depends on the server, so the limit is tried at a few
    margins above the memory in use; at least one of them must split the batch."""
    from django_debounce.backends import record

    seed_many = record.seed_many
    split = []
    for margin in (5_000, 20_000, 60_000, 120_000):
        player = Player(failover, [PLAIN] * KEYS)

        def seed_and_limit(*args: Any, _p: Player = player, _m: int = margin, **kw: Any) -> Any:
            out = seed_many(*args, **kw)
            used = int(_p.admin.info("memory")["used_memory"])
            _p.admin.config_set("maxmemory-policy", "noeviction")
            _p.admin.config_set("maxmemory", used + _m)
            _p.oom = True
            return out

        monkeypatch.setattr(record, "seed_many", seed_and_limit)
        try:
            player.step("many", 0, 0)
            monkeypatch.setattr(record, "seed_many", seed_many)
            player.admin.config_set("maxmemory", 0)
            player.oom = False
            stores = [m.store for m in player.pool]
            if "d" in stores and "r" in stores:
                split.append(margin)
                player.step("deliver", stores.index("d"), 0)  # the database store claims
                player.step("trigger", 0, 1)  # merges into the Redis flight, after that claim
                player.step("flushall", 0, 0)
                player.step("finish", 0, 0)
            player.end()
        finally:
            player.stack.close()
    assert split, "no margin split the batch between Redis and the database store"


def test_a_takeover_marks_a_redis_flight_in_redis_time(
    failover: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database's clock runs 50 ms behind Redis's. Redis records run 1 idle (not yet
    drained) and opens flight 2; Redis goes down and the database store takes the row over,
    marking the Redis flight beside it at its own clock: earlier than run 1's idle record.
    The recorder then took that stale record for "idle in Redis" and cleared the mark, and a
    trigger merged into flight 2 after the database store's claim was lost with Redis's state
    (I1). The mark is now at least the row's last write by Redis (Redis's clock)."""
    player = Player(failover, [PLAIN] * KEYS)
    database = player.backend.database
    trigger = database.trigger

    def behind(**kwargs: Any) -> Any:
        kwargs["now"] = kwargs["now"] - timedelta(milliseconds=50)
        return trigger(**kwargs)

    monkeypatch.setattr(database, "trigger", behind)

    def deliver(store: str) -> None:
        player.step("deliver", [m.store for m in player.pool].index(store), 0)

    try:
        player.step("trigger", 0, 0)  # flight 1 in Redis
        deliver("r")
        player.step("finish", 0, 0)  # its idle record waits for the recorder
        player.step("trigger", 0, 1)  # flight 2 opens in Redis
        player.step("down", 0, 0)
        player.step("trigger", 0, 2)  # the takeover
        deliver("d")  # the database store claims
        player.step("back", 1, 0)
        player.step("record", 0, 0)  # run 1's idle record, older than flight 2
        player.step("trigger", 0, 3)  # merges into flight 2, after the database claim
        player.step("flushall", 0, 0)
        player.step("finish", 0, 0)
        player.end()
    finally:
        player.stack.close()


@pytest.mark.parametrize("triggers", [1, 4])
def test_a_refused_batch_of_one_key_new_to_redis_falls_back_whole(
    failover: RedisServer, triggers: int
) -> None:
    """``trigger_many`` of four triggers of one key new to Redis while Redis refuses writes
    (``OOM``): only the first carries the seed and is refused; the later ones find no hash
    and ask for a seed, and they share its refusal rather than being seeded in turn (which
    re-counted the refused trigger and, past three rounds, raised instead of falling back).
    All of them fall back to the database store, whose flight holds each once."""
    admin = redis.Redis.from_url(failover.url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    name = f"{TASK}-refused"
    h = key_hash(name, f"{name}:k")
    try:
        out = get_backend().trigger_many(
            task_name=name,
            items=[(f"{name}:k", h, dumps([n])) for n in range(triggers)],
            options=PLAIN,
            now=dt(START),
        )
    finally:
        admin.config_set("maxmemory", 0)
    assert [result.pending for result, _dispatch in out] == list(range(1, triggers + 1))
    row = DebounceKey.objects.get(key_hash=h)
    assert (row.store, row.state, row.pending) == ("database", "pending", triggers)
    assert not admin.exists(get_backend().redis.state_key(h))
