"""Drive a store as triggers, the pump and workers do, and keep a ledger of every trigger from
the store's answers (tests/stores/test_failover_properties.py).

``Driver`` calls the store directly (no worker): ``trigger``/``trigger_many``, the pump's
``take`` (and ``release`` of refused publishes), deliveries of the published messages to
``fire``, ``finish``, the lease keeper's ``extend``, ``flush`` and ``cancel``, with a fake
clock (``now=``, integer microseconds) or the stores' real clocks. Every answer goes into the
ledger, and these are checked as it goes (``claimed``, ``check``) and at the end
(``drain`` then ``check_end``):

- 0 triggers lost: an accepted trigger stays pending until a claim covers it; while the
  ledger holds a pending trigger of a key, so does the key's row (and the other way round);
  at the end every accepted trigger is covered by a run claimed after it that finished ok
  (or was cancelled, or dropped by ``trailing=False``);
- 0 finished runs repeated: a claim covers at least one and at most the pending triggers of
  its key (a lost counter makes it count fewer, never more), each flight and each message
  claims once, and the run gets the payload of the newest trigger it covers;
- 0 flights stranded: a key whose row has something pending or running has a due index
  entry, and after ``drain`` every row is idle with no entry;
- 0 overlapping runs: with ``overlap=False`` no claim while another run of the key is live;
- no error to a caller: every step but ``cancel`` must return; ``cancel`` may raise
  ``StoreUnavailable`` only while ``broken()`` says Redis is broken, and then changes
  nothing;
- the counter fence (fences 1 and 2 of docs/design.md): a live counter in Redis belongs to
  the open flight its key's row fences (the row's counter id, or an older one that the
  row's seal also seals) and dies, in Redis's clock, no later than the row's
  ``counter_until``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django_debounce.backends.base import LiveRun
from django_debounce.exceptions import StoreUnavailable
from django_debounce.keys import dumps, key_hash
from django_debounce.models import DebounceDue, DebounceKey, DebounceRun
from django_debounce.state import Dispatch, Finish, FireAction, FlightOptions
from tests.support.call_options import resolve
from tests.support.helpers import wait_for
from tests.support.peek import peek_database

US = 1_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
START = int(datetime(2030, 1, 1, tzinfo=UTC).timestamp()) * US


def dt(value: int) -> datetime:
    return EPOCH + timedelta(microseconds=value)


def us(value: datetime | None) -> int | None:
    if value is None:
        return None
    return (value - EPOCH) // timedelta(microseconds=1)


@dataclass
class Trig:
    """One trigger the store accepted (or dropped)."""

    id: int
    payload: Any
    status: str = "pending"  # pending, claimed, cancelled, dropped
    run: int | None = None


@dataclass
class Run:
    run_id: int
    seq: int | None
    claim_at: int
    lease_end: int
    triggers: int
    status: str = "live"  # live, ok, retried, lost, superseded
    started: bool = True  # a flush claims a run that its message starts


@dataclass
class Key:
    name: str
    hash: str
    task: str
    options: FlightOptions
    trigs: list[Trig] = field(default_factory=list)
    runs: dict[int, Run] = field(default_factory=dict)
    flights: set[int] = field(default_factory=set)
    claimed_by: set[int] = field(default_factory=set)

    def pending(self) -> list[Trig]:
        return [t for t in self.trigs if t.status == "pending"]


@dataclass
class Message:
    key: str
    seq: int
    due: int  # fake clock: when it arrives; real clock: 0


@dataclass
class Running:
    key: str
    run_id: int
    seq: int | None


class Driver:
    """Plays the callers of ``backend`` and keeps the ledger of its keys.

    ``fake``: every call gets ``now=`` from the fake clock ``self.now`` (each call advances
    it by 1 us); else the stores' own clocks. ``broken()``: whether Redis is broken now
    (``cancel`` may then refuse). ``counters``: reads a key's raw counter hash (``None``:
    Redis cannot be read, skip the fence check); ``redis_offset``: Redis's clock minus the
    fake clock, in microseconds."""

    def __init__(
        self,
        backend: Any,
        *,
        fake: bool = True,
        broken: Callable[[], bool] = lambda: False,
        counters: Callable[[str], dict[bytes, bytes] | None] | None = None,
        redis_offset: int = 0,
    ) -> None:
        self.backend = backend
        self.fake = fake
        self.now = START
        self.broken = broken
        self.counters = counters
        self.redis_offset = redis_offset
        self.keys: dict[str, Key] = {}
        self.pool: list[Message] = []
        self.running: list[Running] = []
        self.made = 0
        self.log: list[str] = []  # what happened, for failure messages

    # -- plumbing ---------------------------------------------------------------------------

    def add_key(self, task: str, name: str, options: FlightOptions) -> Key:
        key = Key(name, key_hash(task, name), task, options)
        self.keys[key.hash] = key
        return key

    def tasks(self) -> dict[str, FlightOptions]:
        return {k.task: k.options for k in self.keys.values()}

    def tick(self) -> datetime | None:
        if not self.fake:
            return None
        now = self.now
        self.now += 1
        return dt(now)

    def note(self, what: str) -> None:
        self.log.append(f"{self.now - START if self.fake else len(self.log)}: {what}")

    def where(self) -> str:
        return "steps:\n  " + "\n  ".join(self.log[-60:])

    def publish(self, key: Key, dispatch: Dispatch | None, at: datetime | None) -> None:
        if dispatch is None:
            return
        assert dispatch.key_hash == key.hash, dispatch
        due = 0 if at is None else us(at) + round(dispatch.countdown * US)  # type: ignore[operator]
        self.pool.append(Message(key.hash, dispatch.seq, due))

    def release(self, key: Key, seq: int) -> None:
        at = self.tick()
        self.note(f"release {key.name} {seq}")
        self.backend.release([Dispatch(key.hash, seq, 0.0, key.task)], now=at)

    @staticmethod
    def payload(value: Any) -> dict[str, Any]:
        return {"args": [value], "kwargs": {}}

    # -- triggers -----------------------------------------------------------------------------

    def _accepted(
        self, key: Key, payload: Any, result: Any, dispatch: Any, at: Any, fails: bool
    ) -> None:
        self.made += 1
        trig = Trig(self.made, payload)
        assert result.key == key.name
        if result.pending == 0:
            assert result.dropped, result
            trig.status = "dropped"
        key.trigs.append(trig)
        if dispatch is not None:
            if fails:  # the broker refused the publish: the caller releases it (I8)
                self.release(key, dispatch.seq)
            else:
                self.publish(key, dispatch, at)

    def trigger(
        self,
        key: Key,
        value: Any,
        *,
        own: Mapping[str, Any] | None = None,
        fails: bool = False,
    ) -> Any:
        """One trigger (``own``: the options it gives for itself, in seconds, ``{"wait": 0}``,
        as ``trigger()`` makes them: ``tests/support/call_options.py``)."""
        opts = resolve(key.options, own or {})
        payload = self.payload(value)
        at = self.tick()
        self.note(f"trigger {key.name} {value} own={own or {}}")
        result, dispatch = self.backend.trigger(
            task_name=key.task,
            key=key.name,
            key_hash=key.hash,
            payload_json=dumps(payload),
            options=opts,
            now=at,
        )
        self._accepted(key, payload, result, dispatch, at, fails)
        return result

    def trigger_many(self, items: Sequence[tuple[Key, Any]], *, fails: bool = False) -> list[Any]:
        """``trigger_many`` of ``(key, value)`` items, all keys of one task."""
        task = items[0][0].task
        assert all(k.task == task for k, _v in items)
        payloads = [self.payload(v) for _k, v in items]
        at = self.tick()
        self.note(f"trigger_many {[(k.name, v) for k, v in items]}")
        results = self.backend.trigger_many(
            task_name=task,
            items=[(k.name, k.hash, dumps(p)) for (k, _v), p in zip(items, payloads, strict=True)],
            options=items[0][0].options,
            now=at,
        )
        assert len(results) == len(items)
        for (key, _v), payload, (result, dispatch) in zip(items, payloads, results, strict=True):
            self._accepted(key, payload, result, dispatch, at, fails)
        return [r for r, _d in results]

    # -- the pump and the worker ------------------------------------------------------------

    def take(self, *, fails: bool = False, limit: int = 100_000) -> Any:
        """The pump takes every due entry (``fails``: every publish refused, released)."""
        at = self.tick()
        self.note(f"take fails={fails}")
        taken = self.backend.take(self.tasks(), limit, now=at)
        seen = [d.key_hash for d in taken.dispatches]
        assert len(seen) == len(set(seen)), f"one key taken twice in one take: {taken}"
        refused = []
        for dispatch in taken.dispatches:
            key = self.keys[dispatch.key_hash]
            assert dispatch.task_name == key.task
            if fails:
                refused.append((key, dispatch.seq))
            else:
                self.publish(key, dispatch, at)
        for key, seq in refused:
            self.release(key, seq)
        self.sync()
        return taken

    def deliver(self, i: int, *, on_time: bool = True) -> Any:
        msg = self.pool.pop(i % len(self.pool))
        if self.fake and on_time:
            self.now = max(self.now, msg.due)
        return self.fire(self.keys[msg.key], msg.seq)

    def fire(self, key: Key, seq: int | None) -> Any:
        at = self.tick()
        self.note(f"fire {key.name} seq={seq}")
        decision = self.backend.fire(
            key.hash,
            seq,
            task_name=key.task,
            options=key.options,
            now=at,
        )
        self.note(f"  -> {decision.action}")
        self.publish(key, decision.dispatch, at)
        if decision.action == FireAction.CLAIM:
            assert decision.claim is not None
            self.claimed(key, decision.claim, seq)
        else:
            self.sync(key)
        return decision

    def claimed(self, key: Key, claim: Any, seq: int | None) -> None:
        run = key.runs.get(claim.run_id)
        if run is not None and not run.started and run.status == "live":
            run.started = True  # the message of a flush starts the run it claimed
            self.running.append(Running(key.hash, claim.run_id, seq))
            return
        self._claim(
            key,
            claim.run_id,
            claim.flight_id,
            claim.triggers,
            claim.payload,
            us(claim.started_at),
            seq,
        )  # type: ignore[arg-type]
        self.running.append(Running(key.hash, claim.run_id, seq))

    def _claim(
        self,
        key: Key,
        run_id: int,
        flight_id: int,
        triggers: int,
        payload: Any,
        started: int,
        seq: int | None,
        *,
        flushed: bool = False,
    ) -> None:
        self.sync(key)  # runs the store found lost in this step
        where = f"claim of {key.name} run {run_id}; {self.where()}"
        assert flight_id not in key.flights, f"flight claimed twice: {where}"
        key.flights.add(flight_id)
        if seq is not None and not flushed:
            assert seq not in key.claimed_by, f"message {seq} claimed twice: {where}"
            key.claimed_by.add(seq)
        live = [r for r in key.runs.values() if r.status == "live"]
        if not key.options.overlap:
            assert not live, f"overlapping runs: {live} still live at {where}"
        for run in live:
            run.status = "superseded"  # overlap: the store follows only the newest run
        pending = key.pending()
        assert pending, f"a claim with no trigger pending (a finished run repeated): {where}"
        assert 1 <= triggers <= len(pending), (
            f"claim of {triggers} triggers, {len(pending)} pending: {where}"
        )
        if payload is not None:
            newest = max(pending, key=lambda t: t.id)
            assert payload == newest.payload, (
                f"the run got {payload}, its newest trigger {newest.payload}: {where}"
            )
        for trig in pending:
            trig.status, trig.run = "claimed", run_id
        lease = round(key.options.lease * US)
        key.runs[run_id] = Run(run_id, seq, started, started + lease, triggers)
        key.runs[run_id].started = not flushed

    def run_due(self, key: Key) -> Any:
        """An in-process claim (``run_due``): no message, no fencing."""
        return self.fire(key, None)

    def finish(self, i: int, *, ok: bool = True, retry_in: float | None = None) -> None:
        run = self.running.pop(i % len(self.running))
        key = self.keys[run.key]
        at = self.tick()
        self.note(f"finish {key.name} run {run.run_id} ok={ok} retry_in={retry_in}")
        end = Finish(ok=ok, error="" if ok else "boom", retry_in=retry_in, give_up=False)
        dispatch = self.backend.finish(
            key.hash,
            run.run_id,
            end,
            task_name=key.task,
            options=key.options,
            now=at,
        )
        self.publish(key, dispatch, at)
        self.sync(key)

    def crash(self, i: int) -> None:
        """The worker of a claimed run dies: the run never finishes (its lease runs out)."""
        run = self.running.pop(i % len(self.running))
        self.note(f"crash run {run.run_id} of {self.keys[run.key].name}")

    def extend(self, i: int) -> None:
        """The lease keeper extends a run its message claimed (fake clock only)."""
        runs = [r for r in self.running if r.seq is not None]
        if not runs or not self.fake:
            return
        run = runs[i % len(runs)]
        key = self.keys[run.key]
        at = self.tick()
        self.note(f"extend run {run.run_id} of {key.name}")
        live = LiveRun(key.hash, run.seq, key.options.lease, key.task, key.options)  # type: ignore[arg-type]
        (got,) = self.backend.extend([live], now=at)
        if got is not None:
            key.runs[run.run_id].lease_end = us(at) + round(got * US)  # type: ignore[operator]
        self.sync(key)

    # -- operators ----------------------------------------------------------------------------

    def flush(self, key: Key) -> None:
        at = self.tick()
        self.note(f"flush {key.name}")
        before = set(key.runs)
        dispatch = self.backend.flush(key.hash, task_name=key.task, options=key.options, now=at)
        self.publish(key, dispatch, at)
        claimed = (
            DebounceRun.objects.filter(debounce_key__key_hash=key.hash)
            .exclude(run_id__in=before)
            .values_list("run_id", "flight_id", "triggers", "started_at")
        )
        for run_id, flight_id, triggers, started in claimed:  # the flush claimed the flight
            self.note(f"  -> claimed run {run_id}")
            seq = None if dispatch is None else dispatch.seq
            self._claim(key, run_id, flight_id, triggers, None, us(started), seq, flushed=True)  # type: ignore[arg-type]
        self.sync(key)

    def cancel(self, key: Key) -> int | None:
        """A cancel; ``None`` when it refused (``StoreUnavailable``, Redis broken)."""
        before = peek_database(key.hash, False)
        at = self.tick()
        self.note(f"cancel {key.name}")
        try:
            dropped = self.backend.cancel(key.hash, task_name=key.task, options=key.options, now=at)
        except StoreUnavailable:
            assert self.broken(), f"cancel refused while Redis is healthy; {self.where()}"
            assert peek_database(key.hash, False) == before, "a refused cancel changed the row"
            self.note("  -> StoreUnavailable")
            return None
        pending = key.pending()
        assert (dropped > 0) == bool(pending) and dropped <= len(pending), (
            f"cancel dropped {dropped}, {len(pending)} pending; {self.where()}"
        )
        for trig in pending:
            trig.status = "cancelled"
        self.sync(key)
        return dropped

    # -- the ledger against the store's record ------------------------------------------------

    def sync(self, key: Key | None = None) -> None:
        """Follow what the store recorded of the live runs: finished ok, retried (their
        triggers pending again), lost (their lease ran out: pending again)."""
        for k in [key] if key is not None else list(self.keys.values()):
            live = {r.run_id: r for r in k.runs.values() if r.status == "live"}
            if not live:
                continue
            outcomes = DebounceRun.objects.filter(
                debounce_key__key_hash=k.hash, run_id__in=list(live)
            ).values_list("run_id", "outcome")
            for run_id, outcome in outcomes:
                run = live[run_id]
                if outcome == DebounceRun.Outcome.SUCCESS:
                    run.status = "ok"
                elif outcome in (DebounceRun.Outcome.RETRY, DebounceRun.Outcome.LOST):
                    run.status = "retried" if outcome == DebounceRun.Outcome.RETRY else "lost"
                    for trig in k.trigs:
                        if trig.status == "claimed" and trig.run == run_id:
                            trig.status, trig.run = "pending", None
                    self.running = [
                        r for r in self.running if (r.key, r.run_id) != (k.hash, run_id)
                    ]
                else:
                    assert outcome == DebounceRun.Outcome.RUNNING, (run, outcome)

    def check(self) -> None:
        """The checks that hold after every step (see the module docstring)."""
        self.sync()
        hashes = list(self.keys)
        rows = {
            r["key_hash"]: r
            for r in DebounceKey.objects.filter(key_hash__in=hashes).values(
                "key_hash", "pending", "running_until", "counter_id", "counter_until"
            )
        }
        entries = set(
            DebounceDue.objects.filter(key_hash__in=hashes).values_list("key_hash", flat=True)
        )
        for key in self.keys.values():
            row = rows.get(key.hash)
            pending = key.pending()
            if row is None:
                assert not pending, f"{key.name}: {len(pending)} pending, no row; {self.where()}"
                continue
            busy = row["pending"] > 0 or row["running_until"] is not None
            assert busy == (key.hash in entries), (
                f"{key.name}: row {row}, due index entry {key.hash in entries}: a stranded "
                f"flight; {self.where()}"
            )
            assert (row["pending"] > 0) == bool(pending), (
                f"{key.name}: row pending {row['pending']}, ledger {len(pending)}: a lost "
                f"trigger; {self.where()}"
            )
            assert row["pending"] <= len(pending), (
                f"{key.name}: row pending {row['pending']} > ledger {len(pending)}; {self.where()}"
            )
            self.check_counter(key, row)

    def check_counter(self, key: Key, row: dict[str, Any]) -> None:
        if self.counters is None or not self.fake:
            return
        counter = self.counters(self.backend.counter_key(key.hash))
        if not counter or b"s" in counter:
            return  # none, or a tombstone
        redis_now = self.now + self.redis_offset
        x = int(counter[b"x"])
        if x <= redis_now:
            return  # dead: merges refuse it
        where = f"{key.name}: a live counter {counter} (Redis now {redis_now}), row {row}"
        # the row names it, or a later counter whose seal also seals it (seal.lua: "of id
        # ARGV[1] or an older one"), and whose fence covers it (``counter_until``)
        assert int(counter[b"i"]) <= row["counter_id"], f"fence 1: {where}; {self.where()}"
        until = us(row["counter_until"])
        assert until is not None and row["pending"] > 0, f"fence 1: {where}; {self.where()}"
        assert x <= until + self.redis_offset, f"fence 2: {where}; {self.where()}"

    # -- the end ------------------------------------------------------------------------------

    def drain(self, rounds: int = 20_000, timeout: float = 60.0) -> None:
        """Run everything left with Redis healthy: live runs finish ok, messages are
        delivered (on time), the pump takes what is due."""
        tasks = self.tasks()
        for _round in range(rounds):
            if self.running:
                self.finish(0)
                continue
            if self.pool:
                first = min(range(len(self.pool)), key=lambda i: self.pool[i].due)
                self.deliver(first)
                continue
            at = dt(self.now) if self.fake else None
            next_in = self.backend.peek(list(tasks), now=at)
            if next_in is None:
                break
            if self.fake:
                self.now += max(round(next_in * US), 0)
            elif next_in > 0:
                wait_for(
                    lambda: (self.backend.peek(list(tasks)) or 0) <= 0,
                    timeout=timeout,
                    interval=0.02,
                    message="the next due entry",
                )
            self.take()
        else:
            raise AssertionError(f"the keys did not become idle; {self.where()}")

    def check_end(self) -> None:
        """After ``drain``: every trigger covered, every row idle with no entry."""
        self.check()
        for key in self.keys.values():
            for trig in key.trigs:
                if trig.status in ("cancelled", "dropped"):
                    continue
                assert trig.status == "claimed" and trig.run is not None, (
                    f"{key.name}: trigger {trig.id} never ran; {self.where()}"
                )
                run = key.runs[trig.run]
                assert run.status in ("ok", "superseded"), (
                    f"{key.name}: trigger {trig.id} was left with run {run}; {self.where()}"
                )
        rows = DebounceKey.objects.filter(key_hash__in=list(self.keys)).values_list(
            "key_hash", "pending", "running_until"
        )
        for hashed, pending, running in rows:
            assert (pending, running) == (0, None), f"{self.keys[hashed].name} not idle"
        assert not DebounceDue.objects.filter(key_hash__in=list(self.keys)).exists()
