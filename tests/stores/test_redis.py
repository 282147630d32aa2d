"""The Redis store: its layout (sharded hash tags, the lean hash, TTLs, the due index),
``DEBOUNCE_REDIS_PREFIX`` and ``DEBOUNCE_REDIS_URL``, many processes on one key, awkward keys,
Redis outages with the ``auto`` store, the recheck of durable records against Redis, and the
recorder (docs/design.md, "The Redis layout", "The durable record", "Failover of the auto
store").

Everything runs against real Redis servers (the suite's, or one a test starts and stops) and
real worker processes; nothing is mocked.
"""

from __future__ import annotations

import copy
import json
import signal
import time
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django.utils import timezone
from redis.crc import key_slot

from django_debounce.backends import get_backend
from django_debounce.backends.redis import (
    SHARDS,
    RedisBackend,
    idle_ttl_ms,
    key_hash_of,
    key_id,
    shard_of,
)
from django_debounce.checks import check_backend
from django_debounce.keys import key_hash
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.recorder import drain_all
from django_debounce.state import Finish, FireAction
from tests.support.helpers import stays, wait_for
from tests.support.procs import trigger_from_processes
from tests.support.servers import RedisServer, free_port
from tests.support.workers import Worker
from tests.testapp.models import RunLog
from tests.testapp.tasks import batch, eta, failover, flaky, record, record_slow

US = 1_000_000
# The prefix of store-level tests whose records no worker's recorder may drain meanwhile (the
# suite's worker drains the default prefix's).
ISOLATED = "debounce-isolated"


def hashed(task, *args) -> str:
    return key_hash(task.name, task.resolve(args, {})[0])


def cache_client() -> redis.Redis:
    """The Redis of the cache alias (the Redis store's client when no URL is set)."""
    return redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])


def fields(backend: RedisBackend, h: str) -> dict[str, str]:
    return backend.peek_state(h) or {}


def entry(backend: RedisBackend, h: str, task_name: str) -> int | None:
    score = backend.client.zscore(backend.shard_prefix(shard_of(h)) + "due:" + task_name, key_id(h))
    return None if score is None else int(score)


def later(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


# -- the layout ---------------------------------------------------------------------------------


def test_keys_of_one_debounce_key_share_one_cluster_slot_and_shards_spread():
    backend = RedisBackend()
    h = key_hash("testapp.record", "any key")
    shard = shard_of(h)
    assert shard == int(h[:4], 16) % SHARDS
    ident = key_id(h)
    assert len(ident) == 43 and "=" not in ident and key_hash_of(ident) == h
    assert backend.shard_prefix(shard) == f"debounce{{{shard}}}:"
    state = backend.state_key(h)
    assert state == f"debounce{{{shard}}}:{ident}"
    prefix = backend.shard_prefix(shard)
    related = [
        state,
        state + ":c",
        state + ":r",
        prefix + "due:testapp.record",
        prefix + "next:testapp.record",
        prefix + "rec",
    ]
    assert {key_slot(k.encode()) for k in related} == {key_slot(state.encode())}
    # the 16 shards are 16 slots, spread over the slot range (a 3-node cluster gets some each)
    slots = sorted(key_slot(backend.shard_prefix(s).encode()) for s in range(SHARDS))
    assert len(set(slots)) == SHARDS
    assert [sum(1 for s in slots if lo <= s < lo + 5462) for lo in (0, 5462, 10924)] != [16, 0, 0]
    assert all(any(lo <= s < lo + 5462 for s in slots) for lo in (0, 5462, 10924))


@pytest.mark.django_db(transaction=True)
@override_settings(DEBOUNCE_BACKEND="redis")
def test_a_pending_key_is_a_lean_hash_without_ttl_and_one_index_entry(unique_tag):
    backend = get_backend()
    h = hashed(record_slow, unique_tag)
    result = record_slow.trigger(unique_tag)  # wait 60 s: waits in the index, nothing published
    assert not result.scheduled and result.pending == 1
    got = fields(backend, h)
    # zero fields are absent: no run yet, no message out, last trigger == first trigger
    assert set(got) == {"p", "f", "ft", "d", "T", "pl"}, got
    assert (got["p"], got["f"], got["T"]) == ("1", "1", "1")
    assert got["pl"] == f'["{unique_tag}"]'  # the arguments alone (no keyword arguments)
    assert int(got["d"]) - int(got["ft"]) == 60 * US
    assert backend.client.pttl(backend.state_key(h)) == -1  # pending: no TTL
    due = int(got["d"])
    assert entry(backend, h, record_slow.name) == due
    nxt = backend.client.get(backend.shard_prefix(shard_of(h)) + "next:" + record_slow.name)
    assert nxt is not None and int(nxt) <= due
    assert 55 < backend.peek([record_slow.name]) <= 60
    # the durable record is written once, when the flight opens
    row = DebounceKey.objects.get(key_hash=h)
    assert (row.store, row.state, row.pending, row.flight_id) == ("redis", "pending", 1, 1)
    assert row.recheck_at is not None and row.recheck_at > row.due_at

    record_slow.trigger(unique_tag)  # a plain merge: the hot path
    got = fields(backend, h)
    assert set(got) == {"p", "f", "ft", "lt", "d", "T", "pl"}, got
    assert (got["p"], got["T"]) == ("2", "2")
    assert int(got["d"]) > due
    # a merge only moves the due time later: the entry stays (early, never late)
    assert entry(backend, h, record_slow.name) == due
    assert backend.client.pttl(backend.state_key(h)) == -1
    # merged triggers never write the database
    assert DebounceKey.objects.get(key_hash=h).pending == 1
    # one hash, one index entry (and the index's lower bound), nothing else of this key
    prefix = backend.shard_prefix(shard_of(h))
    assert {k.decode() for k in backend.client.keys("debounce*")} == {
        backend.state_key(h),
        prefix + "due:" + record_slow.name,
        prefix + "next:" + record_slow.name,
    }


@pytest.mark.django_db(transaction=True)
@override_settings(
    DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_IDLE_TTL=7, DEBOUNCE_REDIS_PREFIX=ISOLATED
)
def test_idle_keys_get_a_ttl_pending_and_running_ones_none(unique_tag):
    backend = get_backend()
    opts = record.flight_options()
    h = hashed(record, unique_tag)
    rkey = backend.state_key(h)
    t0 = timezone.now()
    args = dict(
        task_name=record.name,
        key=record.resolve((unique_tag,), {})[0],
        key_hash=h,
        payload_json=f'["{unique_tag}"]',
        options=opts,
    )
    _result, dispatch = backend.trigger(**args, now=t0)
    assert dispatch is not None  # due within the pump interval: out at once
    assert fields(backend, h)["tk"] == "1"
    assert entry(backend, h, record.name) == int(fields(backend, h)["ta"]) + 60 * US  # + grace
    decision = backend.fire(
        h, dispatch.seq, task_name=record.name, options=opts, now=t0 + timedelta(seconds=1)
    )
    assert decision.action is FireAction.CLAIM
    running = fields(backend, h)
    assert backend.client.pttl(rkey) == -1  # running: no TTL
    assert entry(backend, h, record.name) == int(running["ru"])  # the lease end
    assert int(running["ru"]) - int(running["lr"]) == int(opts.lease * US)
    assert {"r", "ru", "rs", "rt", "rf", "R", "lr"} <= set(running)
    assert not {"p", "tk", "ta", "d", "ft"} & set(running)
    # a trigger during the run: pending behind the live run, still no TTL
    backend.trigger(**args, now=t0 + timedelta(seconds=2))
    assert backend.client.pttl(rkey) == -1
    follow = backend.finish(
        h, 1, Finish(ok=True), task_name=record.name, options=opts, now=t0 + timedelta(seconds=3)
    )
    assert follow is not None and backend.client.pttl(rkey) == -1
    decision = backend.fire(
        h, follow.seq, task_name=record.name, options=opts, now=t0 + timedelta(seconds=4)
    )
    assert decision.action is FireAction.CLAIM and decision.claim.run_id == 2
    assert (
        backend.finish(
            h,
            2,
            Finish(ok=True),
            task_name=record.name,
            options=opts,
            now=t0 + timedelta(seconds=5),
        )
        is None
    )
    idle = fields(backend, h)
    # idle: nothing pending, no run, no message; the lodash edge history stays for a while
    assert not {"p", "ru", "rs", "rt", "tk", "ta", "d", "rp"} & set(idle), idle
    assert (idle["R"], idle["T"], idle["lo"]) == ("2", "2", "success") and "M" not in idle
    ttl = backend.client.pttl(rkey)
    assert 0 < ttl <= idle_ttl_ms(opts) == int((0.3 + 7) * 1000) + 1
    assert entry(backend, h, record.name) is None
    # the recorder writes the claims and finishes to the durable record
    drain_all()  # (a worker's recorder, if one runs, may have drained some already)
    wait_for(
        lambda: (
            DebounceRun.objects.filter(debounce_key__key_hash=h, outcome="success").count() == 2
        ),
        timeout=10,
    )
    row = DebounceKey.objects.get(key_hash=h)
    assert (row.state, row.pending, row.runs, row.triggers, row.recheck_at) == (
        "idle",
        0,
        2,
        2,
        None,
    )
    runs = list(DebounceRun.objects.filter(debounce_key=row).order_by("run_id"))
    assert [(r.store, r.run_id, r.outcome, r.triggers) for r in runs] == [
        ("redis", 1, "success", 1),
        ("redis", 2, "success", 1),
    ]


@pytest.mark.django_db(transaction=True)
def test_two_prefixes_share_one_redis_without_meeting(unique_tag):
    h = hashed(record_slow, unique_tag)
    client = cache_client()
    with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_PREFIX="alpha"):
        alpha = get_backend()
        record_slow.trigger(unique_tag)
        record_slow.trigger(unique_tag)
    # the other deployment has a database of its own: its records are not these
    DebounceKey.objects.all().delete()
    with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_PREFIX="beta"):
        beta = get_backend()
        assert beta.state_key(h) == alpha.state_key(h).replace("alpha{", "beta{", 1)
        assert beta.peek([record_slow.name]) is None  # alpha's entry is not beta's
        record_slow.trigger(unique_tag)
        later_ = later(120)
        taken = beta.take({record_slow.name: record_slow.flight_options()}, 100, now=later_)
        assert [d.key_hash for d in taken.dispatches] == [h]
        assert beta.live_state(h)["pending"] == 1
    assert alpha.live_state(h)["pending"] == 2  # untouched by beta's trigger and take
    assert fields(alpha, h).get("tk") is None
    keys = {k.decode() for k in client.keys(f"*{key_id(h)}*")}
    assert keys == {alpha.state_key(h), beta.state_key(h)}
    assert not client.keys("debounce*")  # the default prefix is not used by either
    with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_PREFIX="a{b"):
        with pytest.raises(ImproperlyConfigured, match="DEBOUNCE_REDIS_PREFIX"):
            record_slow.trigger(unique_tag)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backend_name", ["redis", "auto"])
def test_redis_url_gives_the_store_a_redis_of_its_own(backend_name, tmp_path, unique_tag, eager):
    server = RedisServer(tmp_path)
    server.start()
    try:
        own = redis.Redis.from_url(server.url)
        with override_settings(DEBOUNCE_BACKEND=backend_name, DEBOUNCE_REDIS_URL=server.url):
            backend = get_backend("redis")
            h = hashed(record, unique_tag)
            record.trigger(unique_tag)
            assert own.exists(backend.state_key(h))
            assert not cache_client().keys("debounce*")  # not in the cache alias's Redis
            assert DebounceKey.objects.get(key_hash=h).store == "redis"
            from django_debounce.testing import run_due

            assert run_due(now=later(5)) == 1
        assert list(RunLog.objects.filter(tag=unique_tag).values_list("triggers", flat=True)) == [1]
        assert own.hget(backend.state_key(h), "R") == b"1"
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_a_redis_restart_fails_no_trigger_on_the_direct_path(tmp_path, unique_tag):
    """The direct path (a merged trigger, ``trigger_many``) keeps a connection per thread; a
    server that closed it (a restart, an idle timeout) must not fail the next trigger: the
    connection is checked before use, as redis-py's pool checks the ones it hands out."""
    from django_debounce import trigger_many

    server = RedisServer(tmp_path, persistent=True)
    server.start()
    try:
        with override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_URL=server.url):
            backend = get_backend("redis")
            assert backend._direct is not None  # a plain client: the direct path is taken
            record.trigger(unique_tag)
            record.trigger(unique_tag)  # merged: the hot path's connection is now open
            trigger_many(record, [f"{unique_tag}-{i}" for i in range(3)])
            server.stop()
            server.start()  # the same data (append-only file), every connection closed
            # (and no script loaded: the direct path's NOSCRIPT replies load them again)
            record.trigger(unique_tag)
            trigger_many(record, [f"{unique_tag}-{i}" for i in range(3)])
            assert backend.live_state(hashed(record, unique_tag))["pending"] == 3
            for i in range(3):
                assert backend.live_state(hashed(record, f"{unique_tag}-{i}"))["pending"] == 2
    finally:
        server.stop()


# -- many processes, awkward keys ------------------------------------------------------------


@pytest.mark.worker
def test_twenty_processes_trigger_one_key(worker, unique_tag):
    errors = trigger_from_processes("record_slow", [[[unique_tag]] * 5 for _ in range(20)])
    assert errors == []
    h = hashed(record_slow, unique_tag)
    live = get_backend().live_state(h)
    assert (live["pending"], live["triggers"], live["flight_id"]) == (100, 100, 1)  # I6
    row = DebounceKey.objects.get(key_hash=h)
    assert row.flight_id == 1  # one row, one flight (merged triggers never write it on Redis)
    assert record_slow.cancel(unique_tag) == 100


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("task", [record_slow, batch], ids=["payload", "collect"])
@override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_PREFIX=ISOLATED)
def test_two_triggers_of_a_key_new_to_redis_racing_are_counted_once_each(task, unique_tag):
    """Two triggers of a key new to Redis, interleaved as processes can: both are told to read
    the durable record (the hash is missing); A's upsert opens the record, B's finds it
    pending and takes it for a flight whose Redis state was lost (A's trigger); B makes the
    hash first, with that flight. A's own call must then not count A's trigger again (I6);
    in collect mode its item still joins the batch."""
    from django_debounce.backends import record as durable
    from django_debounce.backends.redis import short_key
    from django_debounce.keys import dumps

    backend = get_backend()
    opts = task.flight_options()
    item = {"tag": unique_tag, "n": 1} if opts.collect else unique_tag
    key = task.resolve((item,), {})[0]
    h = key_hash(task.name, key)
    rkey = backend.state_key(h)
    head = backend._head(h, task.name, opts)
    tail = [int(opts.wait * US), -1, 0, opts.collect_limit or 0]
    payloads = {
        "A": dumps({"tag": unique_tag, "n": 1} if opts.collect else [unique_tag]),
        "B": dumps({"tag": unique_tag, "n": 2} if opts.collect else [unique_tag]),
    }

    def call(who: str, seed: str) -> object:
        return backend._run(
            "trigger", rkey, [0, *head, payloads[who], *tail, short_key(key, task.name), seed]
        )

    for who in ("A", "B"):  # {'seed', now}: both must read the durable record
        assert backend._run("trigger", rkey, [0, *head, payloads[who], *tail, "", ""])[0] == b"seed"
    seeds = {
        who: durable.seed(h, key, task.name, None if opts.collect else payloads[who], opts.wait)
        for who in ("A", "B")
    }
    assert seeds["B"].split(",")[6] == "1"  # B sees A's trigger as a lost flight
    call("B", seeds["B"])  # B makes the hash, with A's trigger in it
    call("A", seeds["A"])  # A's own call: counted already
    live = backend.live_state(h)
    assert (live["pending"], live["triggers"], live["flight_id"]) == (2, 2, 1)
    if opts.collect:
        items = backend.client.zrange(rkey + ":c", 0, -1)
        assert sorted(json.loads(i)["n"] for i in items) == [1, 2]
    # a third trigger, after the race, is counted as usual
    task.trigger(item)
    assert backend.live_state(h)["pending"] == 3


@pytest.mark.worker
def test_long_unicode_keys_are_safe_and_do_not_collide(worker, unique_tag):
    # unique per test: the records of the other store's variant may still be drained by the
    # worker's recorder while this one runs
    base = (unique_tag + "\nline one\n" + "é ü 漢字 \t" * 40)[:250]
    a, b = base + "A" * 50, base + "B" * 50
    assert len(a) == len(b) == 300
    record.trigger(a)
    record.trigger(b)
    runs = RunLog.objects.filter(tag__in=[a, b])
    wait_for(lambda: runs.filter(finished__isnull=False).count() == 2)
    assert sorted(runs.values_list("tag", flat=True)) == sorted([a, b])
    hashes = [hashed(record, a), hashed(record, b)]
    assert hashes[0] != hashes[1]
    keys = set(DebounceKey.objects.filter(key_hash__in=hashes).values_list("key", flat=True))
    assert keys == {record.resolve((a,), {})[0], record.resolve((b,), {})[0]}


# -- outages with the auto store ---------------------------------------------------------------


def _covered(tags_last: dict[str, float], timeout: float = 30) -> None:
    """I1: each tag's last trigger is covered by a run that started after it."""
    for tag, at in tags_last.items():
        wait_for(
            lambda tag=tag, at=at: RunLog.objects.filter(tag=tag, started__gte=at).exists(),
            timeout=timeout,
            message=f"a run of {tag} after its last trigger",
        )


def _own_redis_settings(server: RedisServer, timeout: float | None = None) -> dict:
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["LOCATION"] = server.url
    if timeout is not None:
        caches["default"]["OPTIONS"] = {
            "SOCKET_TIMEOUT": timeout,
            "SOCKET_CONNECT_TIMEOUT": timeout,
        }
    return caches


@pytest.mark.worker
def test_redis_stopped_mid_burst_falls_back_to_the_database_and_back_losing_nothing(
    celery_worker_session, transactional_db, tmp_path, unique_tag
):
    from django_debounce.backends.auto import stats

    server = RedisServer(tmp_path)
    server.start()
    own_worker = Worker(
        concurrency=2, queue="debounce-failover", env={"DEBOUNCE_TEST_CACHE_URL": server.url}
    )
    own_worker.start()
    last: dict[str, float] = {}
    fallbacks = stats.fallbacks
    try:
        with override_settings(CACHES=_own_redis_settings(server), DEBOUNCE_BACKEND="auto"):
            for i in range(150):
                if i == 40:
                    server.stop()
                if i == 70:
                    server.start()
                tag = f"{unique_tag}-{i % 3}"
                failover.trigger(tag)  # never raises, Redis up or down
                last[tag] = time.time()
                time.sleep(0.02)
            _covered(last)
            # and back: once Redis answers again, triggers go to Redis
            back = f"{unique_tag}-back"
            wait_for(lambda: get_backend()._usable() is not None, timeout=10)
            failover.trigger(back)
            assert get_backend().redis.live_state(hashed(failover, back)) is not None
            _covered({back: time.time() - 0.5})
        assert stats.fallbacks > fallbacks
        # every run reached the durable record (the recorder, or the database store itself),
        # and no flight ran twice (I5)
        wait_for(
            lambda: (
                DebounceRun.objects.filter(task_name="testapp.failover").count()
                == RunLog.objects.filter(task="testapp.failover").count()
                and not DebounceKey.objects.filter(task_name="testapp.failover")
                .exclude(state="idle")
                .exists()
            ),
            timeout=20,
            message="the records of every run",
        )
        runs = list(DebounceRun.objects.filter(task_name="testapp.failover"))
        assert len({(r.debounce_key_id, r.store, r.flight_id) for r in runs}) == len(runs)
        assert {r.outcome for r in runs} == {"success"}
    finally:
        own_worker.stop()
        server.stop()


@pytest.mark.worker
def test_redis_that_hangs_then_resumes_loses_nothing(
    celery_worker_session, transactional_db, tmp_path, unique_tag
):
    """A Redis that hangs (SIGSTOP) then resumes: triggers during the hang time out and go to
    the database store; after SIGCONT Redis runs the scripts its clients had given up on, and
    its due index, not a record, brings those flights to the pump (I1)."""
    from django_debounce.backends.auto import stats

    fallbacks = stats.fallbacks
    server = RedisServer(tmp_path)
    server.start()
    # a script a client gave up on may still run when Redis resumes: its flight's message is
    # then "out" but was never published, and a pump takes it again after the grace (3 s)
    own_worker = Worker(
        concurrency=2,
        queue="debounce-failover",
        env={"DEBOUNCE_TEST_CACHE_URL": server.url, "DEBOUNCE_TEST_DISPATCH_GRACE": "3"},
    )
    own_worker.start()
    last: dict[str, float] = {}
    try:
        with override_settings(
            CACHES=_own_redis_settings(server, 0.5),
            DEBOUNCE_BACKEND="auto",
            DEBOUNCE_DISPATCH_GRACE=3,
        ):
            for i in range(60):
                if i == 15:
                    server.proc.send_signal(signal.SIGSTOP)
                    stopped = time.monotonic()
                if i == 45:
                    # hung for at least a few seconds (triggers wait out their timeouts)
                    time.sleep(max(0.0, stopped + 3 - time.monotonic()))
                    server.proc.send_signal(signal.SIGCONT)
                tag = f"{unique_tag}-{i % 3}"
                failover.trigger(tag)
                last[tag] = time.time()
                time.sleep(0.02)
            _covered(last)
        assert stats.fallbacks > fallbacks  # the hang sent triggers to the database store
    finally:
        server.proc.send_signal(signal.SIGCONT)
        own_worker.stop()
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_a_trigger_a_hung_redis_ran_after_the_fallback_runs_too(tmp_path, unique_tag, eager):
    """The same hang, step by step: the trigger that timed out went to the database store
    (which took the row over), and Redis, resumed, ran it as well. Both flights run, once
    each; ``run_due`` on the ``auto`` store runs the Redis one through Redis, not through the
    database store's view of its durable record."""
    from django_debounce.testing import run_due

    server = RedisServer(tmp_path)
    server.start()
    client = redis.Redis.from_url(server.url)
    try:
        with override_settings(CACHES=_own_redis_settings(server, 0.5), DEBOUNCE_BACKEND="auto"):
            h = hashed(record, unique_tag)
            backend = get_backend()
            record.trigger(unique_tag)  # Redis holds the flight
            server.proc.send_signal(signal.SIGSTOP)
            try:
                record.trigger(unique_tag)  # times out, falls back to the database
            finally:
                server.proc.send_signal(signal.SIGCONT)
            # Redis ran the script it had been sent: it holds 2 triggers now.
            wait_for(lambda: client.hget(backend.redis.state_key(h), "p") == b"2", timeout=10)
            row = DebounceKey.objects.get(key_hash=h)
            assert (row.store, row.pending) == ("database", 1)
            wait_for(lambda: backend._usable() is not None, timeout=10)
            assert run_due(now=later(5)) == 2
            assert backend.redis.live_state(h)["pending"] == 0
            assert backend.database.due_keys(later(600)) == []
            assert run_due(now=later(600)) == 0
        runs = sorted(RunLog.objects.filter(tag=unique_tag).values_list("triggers", flat=True))
        assert runs == [1, 2]  # the fallback's, and Redis's two
    finally:
        server.proc.send_signal(signal.SIGCONT)
        server.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("redis_had_the_key", [False, True], ids=["new-to-redis", "idle-in-redis"])
def test_redis_never_takes_back_a_row_whose_flight_the_database_store_holds(
    redis_had_the_key, unique_tag, eager
):
    """During an outage the database store took a key's row over and holds a flight there
    (items 1 and 2); Redis answers again and a trigger (item 3) opens a flight in Redis: the
    durable-record write of that opening (a seed for a key new to Redis, an upsert for one
    Redis still holds) must not overwrite the database store's flight, nor may the recorder.
    Both flights run: no item is lost."""
    from django_debounce.keys import dumps
    from django_debounce.testing import run_due

    with override_settings(DEBOUNCE_BACKEND="auto"):
        auto = get_backend()
        item = {"tag": unique_tag, "n": 0}
        key = batch.resolve((item,), {})[0]
        h = key_hash(batch.name, key)
        if redis_had_the_key:
            batch.trigger(item)
            assert run_due(now=later(5)) == 1  # Redis ran item 0; its hash stays, idle
        for n in (1, 2):  # what auto does with triggers while Redis fails
            auto.database.trigger(
                task_name=batch.name,
                key=key,
                key_hash=h,
                payload_json=dumps({"tag": unique_tag, "n": n}),
                options=batch.flight_options(),
            )
        row = DebounceKey.objects.get(key_hash=h)
        assert (row.store, row.pending) == ("database", 2)
        batch.trigger({"tag": unique_tag, "n": 3})  # Redis answers again
        assert auto.redis.live_state(h)["pending"] == 1
        row = DebounceKey.objects.get(key_hash=h)
        assert (row.store, row.state, row.pending) == ("database", "pending", 2)
        assert run_due(now=later(10)) == 2
        assert run_due(now=later(600)) == 0
    runs = [r.payload for r in RunLog.objects.filter(tag=unique_tag).order_by("started")]
    assert sorted(map(sorted, runs)) == sorted(([[0]] if redis_had_the_key else []) + [[1, 2], [3]])


@pytest.mark.django_db(transaction=True)
def test_the_pump_takes_database_flights_while_redis_is_unreachable(unique_tag):
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["LOCATION"] = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens
    caches["default"]["OPTIONS"] = {"SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5}
    with override_settings(CACHES=caches, DEBOUNCE_BACKEND="auto"):
        result = record_slow.trigger(unique_tag)  # falls back to the database store
        assert result.pending == 1
        h = hashed(record_slow, unique_tag)
        assert DebounceKey.objects.get(key_hash=h).store == "database"
        backend = get_backend()
        assert backend.peek([record_slow.name], now=later(120)) <= 0
        taken = backend.take({record_slow.name: record_slow.flight_options()}, 10, now=later(120))
    assert [(d.key_hash, d.store) for d in taken.dispatches] == [(h, "d")]


def test_check_w001_for_redis_backend_on_a_non_redis_cache():
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(DEBOUNCE_BACKEND="redis", CACHES=caches):
        ids = [m.id for m in check_backend()]
    assert ids == ["django_debounce.W001"]


def test_auto_uses_the_database_without_django_redis():
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(DEBOUNCE_BACKEND="auto", CACHES=caches):
        assert get_backend().redis is None
    assert get_backend("auto").redis is not None


# -- the recheck: durable records against Redis -------------------------------------------------


def _trigger(backend, task, tag, now):
    key = task.resolve((tag,), {})[0]
    return backend.trigger(
        task_name=task.name,
        key=key,
        key_hash=key_hash(task.name, key),
        payload_json=f'["{tag}"]',
        options=task.flight_options(),
        now=now,
    )


@pytest.mark.django_db(transaction=True)
@override_settings(
    DEBOUNCE_BACKEND="redis", DEBOUNCE_DISPATCH_GRACE=1, DEBOUNCE_REDIS_PREFIX=ISOLATED
)
def test_recheck_rebuilds_a_pending_flight_whose_hash_was_lost(unique_tag, eager):
    from django_debounce.testing import run_due

    backend = get_backend()
    h = hashed(record, unique_tag)
    record.trigger(unique_tag)
    record.trigger(unique_tag)
    row = DebounceKey.objects.get(key_hash=h)
    # evicted, or Redis restarted without persistence: the hash is gone, the entry stays
    backend.client.delete(backend.state_key(h))
    score = entry(backend, h, record.name)
    assert score is not None
    assert backend.recheck(now=row.recheck_at - timedelta(seconds=0.5)) == 0  # not overdue
    # a take finds the entry without state and drops it (the record restores the flight)
    wait_for(lambda: time.time() * US > score, timeout=5)
    assert run_due() == 0
    assert entry(backend, h, record.name) is None
    assert backend.recheck(now=row.recheck_at) == 1
    rebuilt = fields(backend, h)
    # the record's flight: its first trigger, due time and payload (merged triggers never
    # reached the record: the rebuilt flight counts one, and runs with the last payload)
    assert (rebuilt["p"], rebuilt["f"], rebuilt["pl"]) == ("1", "1", f'["{unique_tag}",0.0,""]')
    assert int(rebuilt["d"]) == int(row.due_at.timestamp() * US)
    assert entry(backend, h, record.name) == int(rebuilt["d"])
    assert backend.client.pttl(backend.state_key(h)) == -1
    assert backend.recheck(now=row.recheck_at) == 0  # rebuilt once
    assert run_due() == 1
    assert list(RunLog.objects.filter(tag=unique_tag).values_list("triggers", flat=True)) == [1]
    row.refresh_from_db()
    assert (row.state, row.runs, row.recheck_at) == ("idle", 1, None)


@pytest.mark.django_db(transaction=True)
@override_settings(
    DEBOUNCE_BACKEND="redis", DEBOUNCE_DISPATCH_GRACE=1, DEBOUNCE_REDIS_PREFIX=ISOLATED
)
def test_recheck_runs_again_a_run_whose_hash_was_lost_while_it_was_live(unique_tag):
    backend = get_backend()
    opts = record.flight_options()
    h = hashed(record, unique_tag)
    t0 = timezone.now()
    _trigger(backend, record, unique_tag, t0)
    decision = backend.fire(
        h, None, task_name=record.name, options=opts, now=t0 + timedelta(seconds=1)
    )
    assert decision.action is FireAction.CLAIM
    drain_all()
    assert DebounceKey.objects.get(key_hash=h).state == "running"
    backend.client.delete(backend.state_key(h))  # lost with its live run
    assert backend.recheck(now=t0 + timedelta(seconds=opts.lease + 5)) == 1
    rebuilt = fields(backend, h)
    assert rebuilt["p"] == "1" and "ru" not in rebuilt  # the run's trigger is pending again (I7)
    assert rebuilt["r"] == "1"  # run ids go on from the record
    again = backend.fire(
        h, None, task_name=record.name, options=opts, now=t0 + timedelta(seconds=opts.lease + 6)
    )
    assert again.action is FireAction.CLAIM and again.claim.run_id == 2


@pytest.mark.django_db(transaction=True)
@override_settings(
    DEBOUNCE_BACKEND="redis", DEBOUNCE_DISPATCH_GRACE=1, DEBOUNCE_REDIS_PREFIX=ISOLATED
)
def test_recheck_syncs_a_stale_pending_record_of_a_key_redis_already_ran(unique_tag):
    backend = get_backend()
    opts = record_slow.flight_options()
    h = hashed(record_slow, unique_tag)
    t0 = timezone.now()
    _trigger(backend, record_slow, unique_tag, t0)
    claim = backend.fire(
        h, None, task_name=record_slow.name, options=opts, now=t0 + timedelta(seconds=61)
    ).claim
    backend.finish(
        h,
        claim.run_id,
        Finish(ok=True),
        task_name=record_slow.name,
        options=opts,
        now=t0 + timedelta(seconds=62),
    )
    # the records of that claim and finish never reached the database (a recorder that died)
    for shard in range(SHARDS):
        backend.client.delete(backend.shard_prefix(shard) + "rec")
    row = DebounceKey.objects.get(key_hash=h)
    assert (row.state, row.pending) == ("pending", 1)
    assert backend.recheck(now=t0 + timedelta(seconds=200)) == 0  # nothing to rebuild
    row.refresh_from_db()
    assert (row.state, row.pending, row.due_at, row.recheck_at) == ("idle", 0, None, None)
    assert "p" not in fields(backend, h)  # and no flight was made from the stale record
    assert backend.recheck(now=t0 + timedelta(seconds=400)) == 0


@pytest.mark.worker
@pytest.mark.parametrize("backend_name", ["redis", "auto"])
def test_a_pump_rebuilds_a_flight_whose_hash_was_deleted_and_runs_it(
    backend_name, celery_worker_session, transactional_db, unique_tag
):
    """End to end: a worker (its store ``redis`` or ``auto``) whose pump rechecks the durable
    records finds a flight whose Redis hash was deleted (as eviction or a restart without
    persistence do), rebuilds it and runs it."""
    worker = Worker(
        concurrency=1, queue="debounce-eta", env={"DEBOUNCE_TEST_BACKEND": backend_name}
    )
    worker.start()
    try:
        with override_settings(DEBOUNCE_BACKEND=backend_name, DEBOUNCE_DISPATCH_GRACE=1):
            backend = get_backend("redis")
            h = hashed(eta, unique_tag)
            eta.trigger(unique_tag)  # wait 3 s: in the index, not in the broker
            triggered = time.time()
            backend.client.delete(backend.state_key(h))
            assert backend.live_state(h) is None
        # the pump drops the entry at the due time, rechecks the record within 15 s after
        # its recheck time (due + 1 s), rebuilds the flight and publishes it
        run = wait_for(
            lambda: RunLog.objects.filter(tag=unique_tag, finished__isnull=False).first(),
            timeout=3 + 1 + 15 + 10,
            message="the rebuilt flight's run",
        )
        assert run.started >= triggered + 3 - 0.1  # I3: not before its due time
        assert run.triggers == 1
        assert stays(lambda: RunLog.objects.filter(tag=unique_tag).count() == 1, duration=1.0)
        wait_for(lambda: DebounceKey.objects.get(key_hash=h).state == "idle", timeout=15)
    finally:
        worker.stop()


@pytest.mark.django_db(transaction=True)
@override_settings(DEBOUNCE_BACKEND="redis", DEBOUNCE_REDIS_PREFIX=ISOLATED)
def test_run_due_records_a_run_whose_body_raised(unique_tag, eager):
    """``run_due`` lets a body's exception propagate after its failure or retry is recorded:
    on the Redis store, in the durable record too (no recorder runs in this process)."""
    from django_debounce.testing import run_due

    flaky.trigger(unique_tag, 1)
    with pytest.raises(RuntimeError, match="flaky failure 0"):
        run_due(now=later(5))
    run = DebounceRun.objects.get(task_name=flaky.name)
    assert (run.store, run.outcome, run.attempt) == ("redis", "retry", 0)
    assert "flaky failure 0" in run.error
    assert run_due(now=later(10)) == 1  # the retry, after its backoff (1 s)
    assert sorted(DebounceRun.objects.values_list("outcome", flat=True)) == ["retry", "success"]


# -- the recorder ------------------------------------------------------------------------------


@pytest.mark.worker
@override_settings(DEBOUNCE_BACKEND="redis")
def test_the_recorder_writes_claims_and_finishes_of_a_worker_to_the_durable_record(
    celery_worker_session, transactional_db, unique_tag
):
    h = hashed(flaky, unique_tag, 1)
    flaky.trigger(unique_tag, 1)  # fails once (retry after 1 s), then succeeds
    wait_for(
        lambda: DebounceRun.objects.filter(debounce_key__key_hash=h, outcome="success").exists(),
        timeout=30,
        message="the success record",
    )
    runs = list(DebounceRun.objects.filter(debounce_key__key_hash=h).order_by("run_id"))
    assert [(r.store, r.run_id, r.attempt, r.outcome) for r in runs] == [
        ("redis", 1, 0, "retry"),
        ("redis", 2, 1, "success"),
    ]
    assert "flaky failure 0" in runs[0].error
    assert all(r.finished_at is not None and r.finished_at >= r.started_at for r in runs)
    wait_for(lambda: DebounceKey.objects.get(key_hash=h).state == "idle", timeout=10)
    row = DebounceKey.objects.get(key_hash=h)
    assert (row.store, row.pending, row.runs, row.triggers, row.last_outcome) == (
        "redis",
        0,
        1,
        1,
        "success",
    )
    assert row.run_id == 2 and row.recheck_at is None
    logs = list(RunLog.objects.filter(tag=unique_tag).order_by("started"))
    assert [log.payload["attempt"] for log in logs] == [0, 1]
