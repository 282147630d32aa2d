"""The Redis store's counters (docs/design.md, "One record per key" and "The counter and its
fences"): a trigger that only joins the open flight with the flight's payload and options is
absorbed by the key's counter and never writes the database; the next step that needs the
flight's whole state seals the counter and folds what it counted into the row. Also the
store's settings: ``DEBOUNCE_REDIS_PREFIX``, ``DEBOUNCE_REDIS_URL``,
``DEBOUNCE_REDIS_CLUSTER``, and a store configured without a Redis.

Everything runs against real Redis servers (the suite's, the suite's Redis Cluster, or one a
test starts and stops) and the test database; nothing is mocked. The store is driven with a
fake clock close to the real one (the counters' expiries are checked against Redis's own
clock when a counter is made).
"""

from __future__ import annotations

import dataclasses
import os
from datetime import datetime, timedelta

import pytest
import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_debounce.backends import get_backend
from django_debounce.backends.redis import RedisBackend, fingerprint, key_id
from django_debounce.checks import check_backend
from django_debounce.keys import dumps, key_hash
from django_debounce.models import DebounceDue, DebounceKey, DebounceRun
from django_debounce.state import Finish, FireAction, FlightOptions
from tests.support.call_options import PER_CALL, other_value, resolve
from tests.support.procs import trigger_from_processes
from tests.support.servers import RedisServer
from tests.testapp.models import RunLog
from tests.testapp.tasks import flaky, record, record_slow

US = 1_000_000
# The counter of a pending key must stay this small (MEMORY USAGE, bytes).
MAX_COUNTER_BYTES = 300

pytestmark = pytest.mark.django_db(transaction=True)


def hashed(task, *args) -> str:
    return key_hash(task.name, task.resolve(args, {})[0])


def trig(
    backend: RedisBackend,
    task,
    tag: str,
    now: datetime,
    *,
    payload: object = None,
    options: FlightOptions | None = None,
):
    """One trigger of ``task`` for key ``tag`` straight to the store, at ``now``; the payload
    is ``[tag]`` (the task's arguments) unless given."""
    key = task.resolve((tag,), {})[0]
    return backend.trigger(
        task_name=task.name,
        key=key,
        key_hash=key_hash(task.name, key),
        payload_json=dumps([tag] if payload is None else payload),
        options=options or task.flight_options(),
        now=now,
    )


def take(backend: RedisBackend, task, now: datetime):
    return backend.take({task.name: task.flight_options()}, 100, now=now)


def counter(backend: RedisBackend, h: str) -> dict[str, str]:
    raw = backend.client.hgetall(backend.counter_key(h))
    return {k.decode(): v.decode() for k, v in raw.items()}


def row_values(h: str) -> dict:
    return DebounceKey.objects.filter(key_hash=h).values().get()


def us(value: datetime) -> int:
    return int(round(value.timestamp() * US))


@pytest.fixture
def backend() -> RedisBackend:
    with override_settings(DEBOUNCE_BACKEND="redis"):
        store = get_backend()
        assert isinstance(store, RedisBackend)
        yield store


@pytest.fixture
def own_redis(tmp_path):
    """A Redis server of the test's own (to restart, or to fill), the store's client on it."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_URL=server.url):
            yield server
    finally:
        server.stop()


# -- merges --------------------------------------------------------------------------------------


def test_a_merged_trigger_writes_no_row_and_the_next_take_folds_it(backend, unique_tag):
    h = hashed(record_slow, unique_tag)  # wait 60 s
    t0 = timezone.now()
    result, dispatch = trig(backend, record_slow, unique_tag, t0)  # opens: the row path
    assert (result.pending, dispatch) == (1, None)
    row = row_values(h)
    assert (row["state"], row["pending"], row["triggers"]) == ("pending", 1, 1)
    assert (row["counter_id"], row["counter_until"]) == (0, None)
    assert counter(backend, h) == {}  # a flight's first trigger makes no counter
    # the second finds no counter: it joins the flight on the row path and makes one
    result, dispatch = trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=1))
    assert (result.pending, dispatch) == (2, None)
    row = row_values(h)
    assert (row["pending"], row["triggers"]) == (2, 2)
    assert row["counter_id"] > 0
    assert row["counter_until"] >= row["due_at"] == t0 + timedelta(seconds=61)
    made = counter(backend, h)
    assert (int(made["i"]), made["n"], made.get("s")) == (row["counter_id"], "0", None)

    for i in (2, 3):
        result, dispatch = trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=i))
        assert (result.flight_id, result.pending, dispatch) == (1, i + 1, None)
    assert row_values(h) == row  # merged: not a column of the row changed
    assert counter(backend, h)["n"] == "2"
    assert backend.counted([h]) == {h: 2}
    live = backend.live_state(h)
    assert (live["pending"], live["triggers"], live["flight_id"]) == (4, 4, 1)

    # the row's due time (t0 + 61 s) comes: the take seals the counter and folds its two
    # triggers, the last at t0 + 3 s, so the flight is due at t0 + 63 s: not yet
    taken = take(backend, record_slow, t0 + timedelta(seconds=62))
    assert taken.dispatches == []
    row = row_values(h)
    assert (row["pending"], row["triggers"], row["counter_until"]) == (4, 4, None)
    assert row["last_trigger_at"] == t0 + timedelta(seconds=3)
    assert row["due_at"] == t0 + timedelta(seconds=63)
    assert counter(backend, h)["s"] == "1"  # a tombstone now
    assert backend.counted([h]) == {}
    taken = take(backend, record_slow, t0 + timedelta(seconds=63))
    assert [d.key_hash for d in taken.dispatches] == [h]
    decision = backend.fire(
        h,
        taken.dispatches[0].seq,
        task_name=record_slow.name,
        options=record_slow.flight_options(),
        now=t0 + timedelta(seconds=64),
    )
    assert decision.action is FireAction.CLAIM
    assert (decision.claim.triggers, decision.claim.payload) == (4, [unique_tag])


def test_a_counter_made_in_a_callers_transaction_waits_for_its_commit(backend, unique_tag):
    """Fence 1 inside the caller's transaction (``on_commit=False``): the counter a flight's
    second trigger makes is made when the outermost transaction commits; one rolled back
    leaves none, so a later trigger cannot merge into a counter of a flight that never was."""
    h = hashed(record_slow, unique_tag)  # wait 60 s
    t0 = timezone.now()
    with pytest.raises(RuntimeError), transaction.atomic():
        trig(backend, record_slow, unique_tag, t0)
        result, _ = trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=1))
        assert result.pending == 2 and row_values(h)["counter_id"] > 0
        assert counter(backend, h) == {}, "a counter made before the row's commit"
        raise RuntimeError("roll back")
    assert counter(backend, h) == {}
    assert not DebounceKey.objects.filter(key_hash=h).exists()
    result, _ = trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=2))
    assert result.pending == 1  # the row path opened a flight: nothing merged anywhere
    with transaction.atomic():
        trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=3))
        assert counter(backend, h) == {}
    assert int(counter(backend, h)["i"]) == row_values(h)["counter_id"]  # made at the commit
    result, _ = trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=4))
    assert result.pending == 3 and counter(backend, h)["n"] == "1"


def test_the_claim_folds_what_the_counter_counted(backend, unique_tag):
    h = hashed(record, unique_tag)  # wait 0.3 s
    opts = record.flight_options()
    t0 = timezone.now()
    for i in range(4):
        trig(backend, record, unique_tag, t0 + timedelta(seconds=i * 0.1))
    assert row_values(h)["pending"] == 2  # the first two: the row path (the second made it)
    assert backend.counted([h]) == {h: 2}
    early = backend.fire(
        h, None, task_name=record.name, options=opts, now=t0 + timedelta(seconds=0.45)
    )
    assert early.action is FireAction.REARM  # due at 0.3 s + 0.3 s once folded
    assert row_values(h)["pending"] == 4
    decision = backend.fire(
        h, None, task_name=record.name, options=opts, now=t0 + timedelta(seconds=0.6)
    )
    assert decision.action is FireAction.CLAIM and decision.claim.triggers == 4
    run = DebounceRun.objects.get(debounce_key__key_hash=h)
    assert (run.triggers, run.last_trigger_at) == (4, t0 + timedelta(seconds=0.3))


@pytest.mark.parametrize("option", PER_CALL, ids=[o.name for o in PER_CALL])
def test_another_payload_or_a_per_call_option_takes_the_row_path(backend, unique_tag, option):
    """The payload and every option a trigger call gives for itself (``debounce_wait=`` and
    the like: ``tests/support/call_options.py``) are in the counter's fingerprint."""
    h = hashed(record_slow, unique_tag)
    opts = record_slow.flight_options()
    t0 = timezone.now()
    trig(backend, record_slow, unique_tag, t0)
    trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=0.5))  # makes the counter
    first = row_values(h)["counter_id"]
    assert counter(backend, h)["f"] == fingerprint(dumps([unique_tag]), opts)

    # another payload (same key: record_slow's key is its tag, the payload has a note)
    other = [unique_tag, 0.0, "note"]
    trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=1), payload=other)
    row = row_values(h)
    assert (row["pending"], row["payload"]) == (3, other)  # the row took it
    assert row["counter_id"] > first  # and a new counter takes that payload
    assert counter(backend, h)["f"] == fingerprint(dumps(other), opts)
    trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=2), payload=other)
    assert backend.counted([h]) == {h: 1}
    assert row_values(h)["pending"] == 3  # merged

    # a per-call option (debounce_wait=4, say): the row path, which folds the count first
    # (and, for a shorter wait, moves the due time earlier than the task's wait would)
    own = resolve(opts, {option.name: other_value(opts, option)})
    assert own != opts
    second = row_values(h)["counter_id"]
    trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=3), payload=other, options=own)
    row = row_values(h)
    assert (row["pending"], row["triggers"]) == (5, 5)
    assert row["counter_id"] > second
    assert counter(backend, h)["f"] == fingerprint(dumps(other), own)
    # the task's own options are another fingerprint: a plain trigger takes the row path too
    trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=4), payload=other)
    assert row_values(h)["pending"] == 6
    assert backend.counted([h]) == {}


def test_a_finish_seals_the_counter_its_retried_triggers_rejoin(backend, unique_tag):
    """Fence 5: a retried run's triggers rejoin the open flight with their earlier anchor, so
    a trigger with a small max_wait of its own may bound the flight earlier than a counter
    made before knows. The finish seals that counter: the next trigger takes the row path,
    which moves the due time (and the index entry) earlier (found by the unit tier's search,
    tests/unit/test_machine_exhaustive.py)."""
    h = hashed(record_slow, unique_tag)  # wait 60 s
    opts = record_slow.flight_options()
    own = dataclasses.replace(opts, max_wait=90.0)
    t0 = timezone.now()
    trig(backend, record_slow, unique_tag, t0)
    claim = backend.fire(
        h, None, task_name=record_slow.name, options=opts, now=t0 + timedelta(seconds=60)
    ).claim
    assert claim is not None
    at = t0 + timedelta(seconds=61)
    trig(backend, record_slow, unique_tag, at, options=own)  # opens flight 2
    trig(backend, record_slow, unique_tag, at, options=own)  # its second: makes its counter
    assert counter(backend, h)["f"] == fingerprint(dumps([unique_tag]), own)
    from django_debounce.state import Finish

    backend.finish(
        h,
        claim.run_id,
        Finish(ok=False, retry_in=1.0, started_at=claim.started_at),
        task_name=record_slow.name,
        options=opts,
        now=at,
    )
    assert counter(backend, h).get("s") == "1"  # sealed by the finish
    trig(backend, record_slow, unique_tag, at, options=own)  # the row path, not the counter
    row = row_values(h)
    assert row["pending"] == 4
    # the rejoined trigger's anchor (t0) bounds the flight at t0 + 90 s, before at + 60 s
    assert row["due_at"] == t0 + timedelta(seconds=90)
    entry = DebounceDue.objects.get(key_hash=h).due_at
    assert entry <= row["due_at"]


def test_a_sealed_counter_refuses_merges_and_the_next_trigger_opens_another(backend, unique_tag):
    h = hashed(record_slow, unique_tag)  # wait 60 s
    t0 = timezone.now()
    trig(backend, record_slow, unique_tag, t0)
    trig(backend, record_slow, unique_tag, t0)  # makes the counter
    trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=1))  # merged
    sealed_id = row_values(h)["counter_id"]
    # the pump's take at the row's due time needs the whole flight: it seals the counter and
    # folds its trigger (the flight is then due at t0 + 61 s: nothing goes out)
    assert take(backend, record_slow, t0 + timedelta(seconds=60)).dispatches == []
    row = row_values(h)
    assert (row["pending"], row["counter_until"]) == (3, None)
    got = counter(backend, h)
    assert (got["i"], got["s"], got["n"]) == (str(sealed_id), "1", "1")  # the count kept
    # the sealed counter absorbs nothing: the trigger takes the row path, opening a new one
    trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=60.5))
    row = row_values(h)
    assert row["pending"] == 4
    assert row["counter_id"] > sealed_id
    made = counter(backend, h)
    assert (int(made["i"]), made["n"], made.get("s")) == (row["counter_id"], "0", None)
    trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=61))
    assert backend.counted([h]) == {h: 1}


# -- the scripts' fences -------------------------------------------------------------------------


def test_open_refuses_past_its_expiry_and_below_a_tombstone(backend, unique_tag):
    h = hashed(record_slow, unique_tag)
    name = backend.counter_key(h)
    open_, seal, merge = (backend.scripts[s] for s in ("open", "seal", "merge"))
    fp = fingerprint(dumps([unique_tag]), record_slow.flight_options())
    now = us(timezone.now())

    def opened(ident: int, x: int) -> int:
        return open_(keys=[name], args=[ident, fp, x, 1, 1, now])

    assert opened(100, now) == 0  # its expiry has passed (x == now)
    assert opened(100, now - 1) == 0
    assert not backend.client.exists(name)
    assert opened(100, now + 10 * US) == 1
    mark = ["mcall", 7]  # a call's mark field and the number of its merge
    assert merge(keys=[name], args=[fp, now + 1, *mark])[:3] == [1, 1, 2]
    # the same merge sent again (its reply was lost): the same answer, counted once
    assert merge(keys=[name], args=[fp, now + 1, *mark])[:3] == [1, 1, 2]
    assert counter(backend, h)["n"] == "1"
    assert merge(keys=[name], args=[fp, now + 10 * US, "mcall", 8])[0] == 0  # x reached
    assert opened(100, now + 10 * US) == 0  # the same id again
    assert opened(99, now + 10 * US) == 0  # an older one

    assert seal(keys=[name], args=[99, 5 * US, now + 2]) == [-1]  # a later counter is left
    assert counter(backend, h)["n"] == "1"
    got = seal(keys=[name], args=[100, 5 * US, now + 3])
    assert got == [1, 2, fp.encode()]  # one trigger, counted 2 us before the seal
    # the tombstone keeps what the seal read, and the merges' marks
    tombstone = {"i": "100", "s": "1", "x": str(now + 3 + 5 * US), "g": "1", "p": "1"}
    tombstone[mark[0]] = "7"
    assert counter(backend, h) == tombstone | {"n": "1", "t": str(now + 1), "f": fp}
    assert 0 < backend.client.pttl(name) <= 5 * 1000 + 1000
    # a seal of the same id again (its step did not commit) reads the same trigger again
    assert seal(keys=[name], args=[100, 5 * US, now + 4]) == [1, 3, fp.encode()]
    assert seal(keys=[name], args=[101, 5 * US, now + 5]) == [0]  # a later id: nothing
    assert counter(backend, h) == tombstone | {"i": "101", "x": str(now + 5 + 5 * US)}
    # a merge sent again after the seal finds its mark: counted (in the sealed flight)
    assert merge(keys=[name], args=[fp, now + 5, *mark])[0] == 1
    assert merge(keys=[name], args=[fp, now + 5, mark[0], 9])[0] == 0  # a new one is not
    # a late open of the sealed id (or an older one) changes nothing; a later id opens
    assert opened(101, now + 10 * US) == 0
    assert opened(50, now + 10 * US) == 0
    assert merge(keys=[name], args=[fp, now + 5, "mother", 1])[0] == 0  # absorbs nothing
    assert counter(backend, h)["s"] == "1"
    assert opened(102, now + 10 * US) == 1
    assert counter(backend, h)["i"] == "102" and "s" not in counter(backend, h)


def test_a_late_open_finds_the_tombstone_of_its_counter(backend, unique_tag):
    """A triggering process paused between its row write and its Redis write: the pump sealed
    the counter the row named before the counter was made; the late open changes nothing."""
    h = hashed(record_slow, unique_tag)
    t0 = timezone.now()
    trig(backend, record_slow, unique_tag, t0)
    trig(backend, record_slow, unique_tag, t0)  # makes the counter
    row = row_values(h)
    ident = int(counter(backend, h)["i"])
    backend.client.delete(backend.counter_key(h))  # as if the open had not run yet
    take(backend, record_slow, t0 + timedelta(seconds=60))  # seals, leaving a tombstone
    assert counter(backend, h)["s"] == "1"
    fp = fingerprint(dumps([unique_tag]), record_slow.flight_options())
    x = us(row["counter_until"])
    assert (
        backend.scripts["open"](keys=[backend.counter_key(h)], args=[ident, fp, x, 2, 2, ""]) == 0
    )
    trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=60.5))  # the row path
    assert row_values(h)["pending"] == 3


def test_seal_works_on_a_full_redis_and_leaves_a_tombstone(own_redis, unique_tag):
    backend = get_backend()
    client = redis.Redis.from_url(own_redis.url)
    h = hashed(record_slow, unique_tag)
    t0 = timezone.now()
    trig(backend, record_slow, unique_tag, t0)
    trig(backend, record_slow, unique_tag, t0)  # makes the counter
    trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=1))  # merged
    assert backend.counted([h]) == {h: 1}
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")  # full: every write is refused
    try:
        with pytest.raises(redis.exceptions.ResponseError, match="maxmemory"):
            client.set("anything", "x")
        # a merge on a full Redis: the row path, nothing raised
        result, _d = trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=2))
        assert result.pending == 4
        # the row path sealed the counter first (seal may write on a full Redis), folding its
        # trigger, and left its tombstone; no new counter could be made
        row = row_values(h)
        assert (row["pending"], row["triggers"]) == (4, 4)
        assert row["last_trigger_at"] == t0 + timedelta(seconds=2)
        got = counter(backend, h)
        assert (got["s"], got["n"]) == ("1", "1")  # a tombstone keeping what it read
        # a take at the due time needs no Redis write beyond a seal: the flight goes out
        taken = take(backend, record_slow, t0 + timedelta(seconds=63))
        assert [d.key_hash for d in taken.dispatches] == [h]
    finally:
        client.config_set("maxmemory", "0")


def test_a_take_seals_on_a_full_redis(own_redis, unique_tag):
    backend = get_backend()
    client = redis.Redis.from_url(own_redis.url)
    h = hashed(record_slow, unique_tag)
    t0 = timezone.now()
    trig(backend, record_slow, unique_tag, t0)
    trig(backend, record_slow, unique_tag, t0)  # makes the counter
    trig(backend, record_slow, unique_tag, t0 + timedelta(seconds=1))  # merged
    ident = row_values(h)["counter_id"]
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    try:
        taken = take(backend, record_slow, t0 + timedelta(seconds=60))
        assert taken.dispatches == []  # folded: due at t0 + 61 s
        row = row_values(h)
        assert (row["pending"], row["counter_until"]) == (3, None)
        assert row["due_at"] == t0 + timedelta(seconds=61)
        got = counter(backend, h)
        assert (got["i"], got["s"], got["n"]) == (str(ident), "1", "1")
    finally:
        client.config_set("maxmemory", "0")


@pytest.mark.parametrize("persistent", [True, False], ids=["same-data", "empty"])
def test_a_redis_restart_between_triggers_fails_no_trigger(tmp_path, unique_tag, persistent):
    """The store's connections are closed by the restart (and its scripts unloaded): the next
    trigger neither raises nor is lost. A Redis that comes back empty forgot its counter: the
    triggers it had counted are missing from the count (what a cache may forget), never the
    flight, which runs at the due time the row holds."""
    from django_debounce import trigger_many

    server = RedisServer(tmp_path, persistent=persistent)
    server.start()
    try:
        with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_URL=server.url):
            backend = get_backend()
            h = hashed(record_slow, unique_tag)
            others = [f"{unique_tag}-{i}" for i in range(3)]
            record_slow.trigger(unique_tag)
            record_slow.trigger(unique_tag)  # makes the counter
            record_slow.trigger(unique_tag)  # merged
            trigger_many(record_slow, others)
            trigger_many(record_slow, others)  # makes the counters, in one pipeline
            trigger_many(record_slow, others)  # merged, in one pipeline
            server.stop()
            server.start()  # every connection closed, no script loaded
            record_slow.trigger(unique_tag)
            trigger_many(record_slow, others)
            lost = 0 if persistent else 1
            assert backend.live_state(h)["pending"] == 4 - lost
            for tag in others:
                assert backend.live_state(hashed(record_slow, tag))["pending"] == 4 - lost
            taken = take(backend, record_slow, timezone.now() + timedelta(seconds=70))
            assert sorted(d.key_hash for d in taken.dispatches) == sorted(
                [h, *(hashed(record_slow, tag) for tag in others)]
            )
            assert DebounceKey.objects.get(key_hash=h).pending == 4 - lost
    finally:
        server.stop()


def test_redis_memory_per_pending_key_is_under_300_bytes(own_redis, unique_tag, record_property):
    backend = get_backend()
    client = redis.Redis.from_url(own_redis.url)
    t0 = timezone.now()
    tags = [f"{unique_tag}-{i}" for i in range(200)]
    for tag in tags:
        trig(backend, record_slow, tag, t0)
    assert client.dbsize() == 0  # a flight's first trigger makes no counter
    for tag in tags:
        trig(backend, record_slow, tag, t0)  # the second makes it
    before = client.info("memory")["used_memory"]
    for tag in tags:
        trig(backend, record_slow, tag, t0 + timedelta(seconds=1))  # merged: n and t set
    sizes = [
        client.memory_usage(backend.counter_key(hashed(record_slow, t)), samples=0) for t in tags
    ]
    assert backend.counted([hashed(record_slow, tags[0])]) == {hashed(record_slow, tags[0]): 1}
    per_key = max(sizes)
    record_property("redis_bytes_per_pending_key", per_key)
    print(f"\nRedis MEMORY USAGE of a pending key's counter: {per_key} bytes")
    assert per_key < MAX_COUNTER_BYTES, sizes[:3]
    assert client.info("memory")["used_memory"] >= before
    assert client.dbsize() == len(tags)  # one Redis key per pending key, nothing else


def test_twenty_processes_trigger_one_key(unique_tag):
    with override_settings(DEBOUNCE_BACKEND="redis"):
        errors = trigger_from_processes("record_slow", [[[unique_tag]] * 5 for _ in range(20)])
        assert errors == []
        h = hashed(record_slow, unique_tag)
        backend = get_backend()
        live = backend.live_state(h)
        assert (live["pending"], live["triggers"], live["flight_id"]) == (100, 100, 1)  # I6
        assert DebounceKey.objects.get(key_hash=h).flight_id == 1  # one row, one flight
        assert record_slow.cancel(unique_tag) == 100  # the cancel seals and folds them all


def test_long_unicode_keys_are_safe_and_do_not_collide(backend, unique_tag):
    base = (unique_tag + "\nline one\n" + "é ü 漢字 \t" * 40)[:250]
    a, b = base + "A" * 50, base + "B" * 50
    t0 = timezone.now()
    for tag in (a, b, a, a):
        trig(backend, record_slow, tag, t0)
    ha, hb = hashed(record_slow, a), hashed(record_slow, b)
    assert ha != hb and backend.counter_key(ha) != backend.counter_key(hb)
    assert backend.counted([ha, hb]) == {ha: 1}
    assert len(key_id(ha)) == 43 and "=" not in key_id(ha)
    keys = set(DebounceKey.objects.filter(key_hash__in=[ha, hb]).values_list("key", flat=True))
    assert keys == {record_slow.resolve((a,), {})[0], record_slow.resolve((b,), {})[0]}


# -- the store's Redis ---------------------------------------------------------------------------


def test_two_prefixes_share_one_redis_without_meeting(unique_tag):
    h = hashed(record_slow, unique_tag)
    t0 = timezone.now()
    with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_PREFIX="alpha"):
        alpha = get_backend()
        trig(alpha, record_slow, unique_tag, t0)
        trig(alpha, record_slow, unique_tag, t0)  # makes the counter
        trig(alpha, record_slow, unique_tag, t0 + timedelta(seconds=1))
        assert alpha.counter_key(h) == f"alpha:{key_id(h)}"
    # the other deployment has a database of its own: these rows are not its rows
    DebounceKey.objects.all().delete()
    with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_PREFIX="beta"):
        beta = get_backend()
        assert beta.counted([h]) == {}  # alpha's counter is not beta's
        for i in (2, 3, 4):
            trig(beta, record_slow, unique_tag, t0 + timedelta(seconds=i))
        assert beta.live_state(h)["pending"] == 3
        assert beta.counted([h]) == {h: 1}
    assert alpha.counted([h]) == {h: 1}  # untouched by beta's triggers
    client = alpha.client
    assert {k.decode() for k in client.keys(f"*{key_id(h)}*")} == {
        alpha.counter_key(h),
        beta.counter_key(h),
    }
    assert not client.keys("debounce:*")  # the default prefix is used by neither


@pytest.mark.parametrize("prefix", ["a{b", "a}b", "", 7])
def test_a_prefix_with_braces_or_empty_is_refused(prefix, unique_tag):
    with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_PREFIX=prefix):
        with pytest.raises(ImproperlyConfigured, match="DEBOUNCE_REDIS_PREFIX"):
            record_slow.trigger(unique_tag)


@pytest.mark.parametrize("backend_name", ["redis", "auto"])
def test_redis_url_gives_the_store_a_redis_of_its_own(backend_name, tmp_path, unique_tag, eager):
    from django_debounce.testing import run_due

    server = RedisServer(tmp_path)
    server.start()
    try:
        own = redis.Redis.from_url(server.url)
        with override_settings(DEBOUNCE_BACKEND=backend_name, DEBOUNCE_REDIS_URL=server.url):
            backend = get_backend()
            assert isinstance(backend, RedisBackend)
            h = hashed(record, unique_tag)
            record.trigger(unique_tag)
            record.trigger(unique_tag)  # makes the counter
            record.trigger(unique_tag)  # merged
            assert own.hget(backend.counter_key(h), "n") == b"1"
            cache = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
            assert not cache.keys("debounce:*")  # not in the cache alias's Redis
            assert run_due(now=timezone.now() + timedelta(seconds=5)) == 1
        assert list(RunLog.objects.filter(tag=unique_tag).values_list("triggers", flat=True)) == [3]
        assert own.hget(backend.counter_key(h), "s") == b"1"  # the claim sealed it
    finally:
        server.stop()


# -- lost replies -------------------------------------------------------------------------------


class LosingConnection(redis.connection.Connection):
    """A connection to the real Redis that, once armed, reads Redis's reply to the next
    command and then raises ``ConnectionError`` (a reset connection, or a timeout after Redis
    ran the command). ``meanwhile`` runs first: what other processes do before the client
    sees the failure."""

    armed = False
    meanwhile = None

    def read_response(self, *args, **kwargs):
        reply = super().read_response(*args, **kwargs)
        if LosingConnection.armed:
            LosingConnection.armed = False
            if LosingConnection.meanwhile is not None:
                LosingConnection.meanwhile()
            raise redis.exceptions.ConnectionError("the reply was lost (connection reset)")
        return reply


@pytest.fixture
def losing():
    """``(caller, worker)``: the Redis store of a web process whose connection loses a reply
    once armed (``retries``: redis-py's own retries), and a worker's store."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    url = settings.REDIS_URL

    def stores(retries: int) -> tuple[RedisBackend, RedisBackend]:
        client = redis.Redis.from_url(
            url, connection_class=LosingConnection, retry=Retry(NoBackoff(), retries)
        )
        caller = RedisBackend()
        caller.__dict__["client"] = client
        worker = RedisBackend()
        worker.__dict__["client"] = redis.Redis.from_url(url)
        return caller, worker

    with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_URL=url):
        yield stores
    LosingConnection.armed, LosingConnection.meanwhile = False, None


@pytest.mark.parametrize("retries", [0, 1], ids=["store-retries", "redis-py-retries"])
def test_a_merge_whose_reply_was_lost_counts_its_trigger_once(losing, unique_tag, retries):
    """The merge ran in Redis and its reply was lost: sent again (by redis-py's retry, or by
    the store), it finds its mark and answers as the first time; the row path never takes it
    (which would count the trigger twice)."""
    caller, worker = losing(retries)
    h = hashed(record, unique_tag)  # wait 0.3 s
    t0 = timezone.now()
    trig(caller, record, unique_tag, t0)  # opens the flight on the row path
    trig(caller, record, unique_tag, t0 + timedelta(seconds=0.1))  # makes the counter
    LosingConnection.armed = True
    result, _ = trig(caller, record, unique_tag, t0 + timedelta(seconds=0.2))
    assert not LosingConnection.armed  # the merge ran and its reply was lost
    assert (result.flight_id, result.pending) == (1, 3)
    assert counter(caller, h)["n"] == "1"
    assert row_values(h)["pending"] == 2  # not on the row too
    decision = worker.fire(
        h, None, task_name=record.name, options=record.flight_options(),
        now=t0 + timedelta(seconds=0.6),
    )  # fmt: skip
    assert decision.action is FireAction.CLAIM
    assert decision.claim.triggers == 3


def test_a_batch_whose_pipeline_reply_was_lost_counts_each_trigger_once(losing, unique_tag):
    """``trigger_many``'s merges go in one pipeline; its replies lost after Redis ran every
    merge, the store sends them again under the same mark: each counts once."""
    caller, _worker = losing(0)
    tags = [f"{unique_tag}-{i}" for i in range(3)]
    t0 = timezone.now()
    for i in range(2):  # each key: a flight and its counter
        for tag in tags:
            trig(caller, record_slow, tag, t0 + timedelta(seconds=i))
    items = [
        (key, key_hash(record_slow.name, key), dumps([tag]))
        for tag in tags
        for key in [record_slow.resolve((tag,), {})[0]]
    ]
    LosingConnection.armed = True
    done = caller.trigger_many(
        task_name=record_slow.name, items=items, options=record_slow.flight_options(),
        now=t0 + timedelta(seconds=2),
    )  # fmt: skip
    assert not LosingConnection.armed  # the pipeline ran and its replies were lost
    assert [(r.pending, d) for r, d in done] == [(3, None)] * 3
    for tag in tags:
        h = hashed(record_slow, tag)
        assert counter(caller, h)["n"] == "1"
        assert row_values(h)["pending"] == 2  # not on the row too


def test_a_merge_lost_while_a_worker_claims_its_flight_runs_once(losing, unique_tag):
    """The merge ran and, before its caller learns it, a worker claims the flight (the seal
    folds the merge): sent again, it finds its mark in the tombstone and is counted in that
    run; no second flight opens for it."""
    caller, worker = losing(0)
    h = hashed(record, unique_tag)  # wait 0.3 s
    opts = record.flight_options()
    t0 = timezone.now()
    trig(caller, record, unique_tag, t0)
    trig(caller, record, unique_tag, t0 + timedelta(seconds=0.1))
    claims = []

    def worker_claims():
        claims.append(
            worker.fire(
                h, None, task_name=record.name, options=opts, now=t0 + timedelta(seconds=0.6)
            )  # fmt: skip
        )

    LosingConnection.armed, LosingConnection.meanwhile = True, worker_claims
    result, dispatch = trig(caller, record, unique_tag, t0 + timedelta(seconds=0.2))
    (claimed,) = claims
    assert claimed.action is FireAction.CLAIM and claimed.claim.triggers == 3
    assert (result.flight_id, dispatch) == (1, None)  # counted in the claimed flight
    worker.finish(
        h, claimed.claim.run_id, Finish(ok=True, started_at=claimed.claim.started_at),
        task_name=record.name, options=opts, now=t0 + timedelta(seconds=0.7),
    )  # fmt: skip
    row = row_values(h)
    assert (row["pending"], row["triggers"], row["runs"], row["state"]) == (0, 3, 1, "idle")
    after = worker.fire(h, None, task_name=record.name, options=opts, now=t0 + timedelta(seconds=2))
    assert after.action is not FireAction.CLAIM
    assert DebounceRun.objects.filter(debounce_key__key_hash=h).count() == 1


def test_a_cluster_that_cannot_be_reached_sends_triggers_to_the_rows(unique_tag):
    """A process whose first use of a Redis Cluster finds no node (redis-py raises
    ``RedisClusterException``, not a ``RedisError``): its triggers take the row path, one
    deferred to a commit among them."""
    nowhere = ["127.0.0.1:1"]  # nothing listens there
    with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_CLUSTER=nowhere):
        t0 = timezone.now()
        result, _ = trig(get_backend(), record_slow, unique_tag, t0)
        assert result.pending == 1
        with transaction.atomic():
            assert record_slow.trigger(f"{unique_tag}-2").deferred
        assert row_values(hashed(record_slow, unique_tag))["pending"] == 1
        assert row_values(hashed(record_slow, f"{unique_tag}-2"))["pending"] == 1


def test_a_redis_cluster_client_counts_and_folds(unique_tag):
    nodes = os.environ.get("DEBOUNCE_TEST_REDIS_CLUSTER")
    if not nodes:
        pytest.fail("DEBOUNCE_TEST_REDIS_CLUSTER is not set: run the suite with scripts/test")
    tags = [f"{unique_tag}-{i}" for i in range(30)]  # keys on every master
    with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_CLUSTER=nodes.split(",")):
        backend = get_backend()
        from redis.cluster import RedisCluster

        assert isinstance(backend.client, RedisCluster)
        hashes = [hashed(record_slow, tag) for tag in tags]
        try:
            masters = {
                backend.client.get_node_from_key(backend.counter_key(h)).name for h in hashes
            }
            assert len(masters) == 3
            from django_debounce import trigger_many

            t0 = timezone.now()
            trig(backend, record_slow, tags[0], t0)
            trig(backend, record_slow, tags[0], t0)  # makes the counter
            made = backend.client.hgetall(backend.counter_key(hashes[0]))
            assert made.get(b"n") == b"0", f"no counter was made: {made}"
            trig(backend, record_slow, tags[0], t0 + timedelta(seconds=1))  # merged
            trigger_many(record_slow, tags)  # one pipeline over the masters
            trigger_many(record_slow, tags)  # makes the others' counters
            trigger_many(record_slow, tags)
            assert backend.counted(hashes) == {h: (4 if h == hashes[0] else 1) for h in hashes}
            assert DebounceKey.objects.get(key_hash=hashes[0]).pending == 2
            for h in hashes:
                assert backend.live_state(h)["pending"] == (6 if h == hashes[0] else 3)
            taken = take(backend, record_slow, timezone.now() + timedelta(seconds=70))
            assert sorted(d.key_hash for d in taken.dispatches) == sorted(hashes)
            assert backend.counted(hashes) == {}
            pending = dict(
                DebounceKey.objects.filter(key_hash__in=hashes).values_list("key_hash", "pending")
            )
            assert pending == {h: (6 if h == hashes[0] else 3) for h in hashes}
        finally:
            for h in hashes:
                backend.client.delete(backend.counter_key(h))


def test_check_w001_for_redis_backend_on_a_non_redis_cache():
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(DEBOUNCE_BACKEND="redis", CACHES=caches):
        ids = [m.id for m in check_backend()]
    assert ids == ["django_debounce.W001"]


def test_the_redis_store_without_a_redis_says_what_to_configure(unique_tag):
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(DEBOUNCE_BACKEND="redis", CACHES=caches):
        with pytest.raises(ImproperlyConfigured, match="DEBOUNCE_REDIS_URL"):
            get_backend().client  # noqa: B018


def test_auto_is_the_database_store_without_a_redis_and_the_redis_store_with_one():
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(DEBOUNCE_BACKEND="auto", CACHES=caches):
        assert get_backend().name == "database"
    with override_settings(DEBOUNCE_BACKEND="auto"):
        assert get_backend().name == "redis"


def test_run_due_records_a_run_whose_body_raised(unique_tag, eager):
    """``run_due`` lets a body's exception propagate after its retry is recorded in the row."""
    from django_debounce.testing import run_due

    with override_settings(DEBOUNCE_BACKEND="redis"):
        flaky.trigger(unique_tag, 1)
        with pytest.raises(RuntimeError, match="flaky failure 0"):
            run_due(now=timezone.now() + timedelta(seconds=5))
        run = DebounceRun.objects.get(task_name=flaky.name)
        assert (run.outcome, run.attempt) == ("retry", 0)
        assert "flaky failure 0" in run.error
        assert run_due(now=timezone.now() + timedelta(seconds=10)) == 1  # after its backoff
    assert sorted(DebounceRun.objects.values_list("outcome", flat=True)) == ["retry", "success"]
