"""The Redis fast path: TTLs, many processes, outages with fallback, awkward keys."""

from __future__ import annotations

import copy
import time

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_debounce.backends import get_backend
from django_debounce.backends.redis import redis_key
from django_debounce.checks import check_backend
from django_debounce.keys import key_hash
from django_debounce.models import DebounceKey, DebounceRun
from tests.conftest import Worker, stays, wait_for
from tests.procs import trigger_from_processes
from tests.servers import RedisServer, free_port
from tests.testapp.models import RunLog
from tests.testapp.tasks import failover, record, record_slow


def hashed(task, *args) -> str:
    return key_hash(task.name, task.resolve(args, {})[0])


@pytest.mark.worker
@override_settings(DEBOUNCE_BACKEND="redis")
def test_short_ttl_counter_always_carries_a_ttl_and_covers_the_last_trigger(
    celery_worker_session, transactional_db, unique_tag
):
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    rkey = redis_key(hashed(record, unique_tag))
    with override_settings(DEBOUNCE_REDIS_TTL=2, DEBOUNCE_DISPATCH_GRACE=0.1):
        start = time.monotonic()
        last = 0.0
        for at in (0.0, 1.9, 2.1):
            time.sleep(max(0.0, start + at - time.monotonic()))
            record.trigger(unique_tag)
            last = time.time()
            ttl = client.pttl(rkey)
            assert 0 < ttl <= 2000, f"TTL after a trigger at {at}s is {ttl} ms"
            live = get_backend().live_state(hashed(record, unique_tag))
            assert live["pending"] >= 1
    runs = wait_for(
        lambda: (r := list(RunLog.objects.filter(tag=unique_tag, started__gte=last))) and r,
        timeout=20,
    )
    assert stays(lambda: client.pttl(rkey) > 0, duration=1.0)
    assert len(runs) == 1
    assert runs[0].started >= last + 0.3
    logs = list(RunLog.objects.filter(tag=unique_tag).order_by("started"))
    assert sum(log.triggers for log in logs) == 3
    live = get_backend().live_state(hashed(record, unique_tag))
    assert live["pending"] == 0 and live["triggers"] == 3


@pytest.mark.worker
def test_twenty_processes_trigger_one_key(worker, unique_tag):
    errors = trigger_from_processes("record_slow", [[[unique_tag]] * 5 for _ in range(20)])
    assert errors == []
    live = get_backend().live_state(hashed(record_slow, unique_tag))
    assert (live["pending"], live["triggers"], live["flight_id"]) == (100, 100, 1)
    assert DebounceKey.objects.filter(task_name="testapp.record_slow").count() == 1
    assert record_slow.cancel(unique_tag) == 100


@pytest.mark.worker
def test_long_unicode_keys_are_safe_and_do_not_collide(worker):
    base = ("line one\n" + "é ü 漢字 \t" * 40)[:250]
    a, b = base + "A" * 50, base + "B" * 50
    assert len(a) == len(b) == 300
    record.trigger(a)
    record.trigger(b)
    wait_for(lambda: RunLog.objects.filter(finished__isnull=False).count() == 2)
    assert sorted(RunLog.objects.values_list("tag", flat=True)) == sorted([a, b])
    keys = set(DebounceKey.objects.values_list("key", flat=True))
    assert keys == {record.resolve((a,), {})[0], record.resolve((b,), {})[0]}
    assert DebounceKey.objects.values("key_hash").distinct().count() == 2


@pytest.mark.worker
def test_redis_outage_mid_burst_loses_nothing(
    celery_worker_session, transactional_db, tmp_path, unique_tag
):
    server = RedisServer(tmp_path)
    server.start()
    own_worker = Worker(
        concurrency=2, queue="debounce-failover", env={"DEBOUNCE_TEST_CACHE_URL": server.url}
    )
    own_worker.start()
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["LOCATION"] = server.url
    last: dict[str, float] = {}
    try:
        with override_settings(CACHES=caches, DEBOUNCE_BACKEND="auto"):
            for i in range(150):
                if i == 40:
                    server.stop()
                if i == 70:
                    server.start()
                tag = f"{unique_tag}-{i % 3}"
                failover.trigger(tag)  # never raises, Redis up or down
                last[tag] = time.time()
                time.sleep(0.02)
            for tag, at in last.items():
                wait_for(
                    lambda tag=tag, at=at: RunLog.objects.filter(tag=tag, started__gte=at).exists(),
                    timeout=60,
                    message=f"a run of {tag} after its last trigger",
                )
        stores = set(
            DebounceKey.objects.filter(task_name="testapp.failover").values_list("store", flat=True)
        )
        assert stores <= {"redis", "database"}
        from django_debounce.backends.auto import stats

        assert stats.fallbacks >= 1
    finally:
        own_worker.stop()
        server.stop()


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


@pytest.mark.django_db(transaction=True)
def test_triggers_a_hung_redis_took_after_the_fallback_are_recovered(tmp_path, unique_tag):
    """A Redis that hangs (SIGSTOP) then resumes executes the scripts its clients had given
    up on: those triggers went to the database too, whose record now says "database, idle"
    once its run finished. Recovery must still find and run what Redis holds (I1)."""
    import signal
    from datetime import timedelta

    from django.utils import timezone

    from django_debounce.recovery import recover
    from django_debounce.testing import run_due
    from tests.celery_app import app

    server = RedisServer(tmp_path)
    server.start()
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["LOCATION"] = server.url
    caches["default"]["OPTIONS"] = {"SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5}
    client = redis.Redis.from_url(server.url)
    app.conf.task_always_eager = True
    try:
        with override_settings(CACHES=caches, DEBOUNCE_BACKEND="auto"):
            h = hashed(record, unique_tag)
            record.trigger(unique_tag)  # Redis holds the flight
            server.proc.send_signal(signal.SIGSTOP)
            try:
                record.trigger(unique_tag)  # times out, falls back to the database
            finally:
                server.proc.send_signal(signal.SIGCONT)
            # Redis ran the script it had been sent: it holds 2 triggers now.
            wait_for(lambda: client.hget(redis_key(h), "p") == b"2", timeout=10)
            assert DebounceKey.objects.get(key_hash=h).store == "database"
            later = timezone.now() + timedelta(seconds=120)
            # The database store's flight runs and finishes (as a worker would run the
            # message that names the database store): its record goes idle.
            database = get_backend("database")
            claim = database.fire(h, None, overlap=False, lease=60, now=later).claim
            record.run_claim(database, claim)
            row = DebounceKey.objects.get(key_hash=h)
            assert (row.store, row.state) == ("database", "idle")
            # Without recovery, nothing would ever run what Redis holds. (The store tries
            # Redis again RETRY_AFTER seconds after a failure.)
            wait_for(lambda: get_backend()._usable() is not None, timeout=10)
            recover()
            assert DebounceKey.objects.get(key_hash=h).store == "redis"
            assert run_due(now=later + timedelta(seconds=120)) == 1
            assert get_backend().live_state(h)["pending"] == 0
        runs = list(RunLog.objects.filter(tag=unique_tag).order_by("started"))
        assert [r.triggers for r in runs] == [1, 2]  # the fallback's, then Redis's two
    finally:
        app.conf.task_always_eager = False
        server.stop()


def _run_database_flight(h: str, now) -> None:
    """Claim and run the database store's flight of ``h`` as a worker would run a message
    that names the database store."""
    database = get_backend("database")
    decision = database.fire(h, None, overlap=False, lease=60, now=now)
    record.run_claim(database, decision.claim)


@pytest.mark.django_db(transaction=True)
def test_recovery_with_redis_unreachable_still_recovers_the_database_flights(unique_tag):
    from datetime import timedelta

    from django.utils import timezone

    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["LOCATION"] = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens
    caches["default"]["OPTIONS"] = {"SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5}
    database = get_backend("database")
    with override_settings(CACHES=caches, DEBOUNCE_BACKEND="auto"):
        idle, lost = f"{unique_tag}-idle", f"{unique_tag}-lost"
        database.trigger(**_trigger_args(idle))  # fell back, then ran: idle, recent
        _run_database_flight(hashed(record, idle), timezone.now() + timedelta(seconds=5))
        database.trigger(**_trigger_args(lost))  # its message was never published
        DebounceKey.objects.filter(key_hash=hashed(record, lost)).update(scheduled=False)
        out = get_backend().recover(grace=60)  # Redis refuses: the database part still runs
    assert [d.key_hash for _name, d in out] == [hashed(record, lost)]


def _trigger_args(tag: str) -> dict:
    key, payload = record.resolve((tag,), {})
    return {
        "task_name": record.name,
        "key": key,
        "key_hash": key_hash(record.name, key),
        "payload": payload,
        "wait": 0.3,
        "max_wait": None,
    }


@pytest.mark.django_db(transaction=True)
def test_a_record_taken_back_from_the_database_store_never_lowers_its_counters(unique_tag):
    """Redis kept old state through an outage in which the database store ran the key twice;
    when recovery hands the record back to Redis, run ids must not go back, or the database
    store's next claim would reuse a run id of its own (a unique-constraint error)."""
    from datetime import timedelta

    from django.utils import timezone

    from django_debounce.recovery import recover
    from django_debounce.testing import run_due
    from tests.celery_app import app

    h = hashed(record, unique_tag)
    t = timezone.now()
    app.conf.task_always_eager = True
    try:
        with override_settings(DEBOUNCE_BACKEND="auto"):
            record.trigger(unique_tag)
            assert run_due(now=t + timedelta(seconds=5)) == 1  # Redis run 1
            database = get_backend("database")
            for i in (1, 2):  # an outage: two triggers and runs on the database store
                database.trigger(**_trigger_args(unique_tag))
                _run_database_flight(h, t + timedelta(seconds=5 + 5 * i))
            assert DebounceKey.objects.get(key_hash=h).run_id == 3
            get_backend("redis").trigger(**_trigger_args(unique_tag))  # what the hung Redis ran
            recover()
            row = DebounceKey.objects.get(key_hash=h)
            assert (row.store, row.run_id) == ("redis", 3)
            assert run_due(now=t + timedelta(seconds=60)) == 1  # Redis runs its trigger
            database.trigger(**_trigger_args(unique_tag))  # a second outage
            _run_database_flight(h, t + timedelta(seconds=70))  # no reused run id
        runs = list(
            DebounceRun.objects.filter(task_name=record.name).values_list("store", "run_id")
        )
        assert sorted(runs) == [
            ("database", 2),
            ("database", 3),
            ("database", 4),
            ("redis", 1),
            ("redis", 2),
        ]
    finally:
        app.conf.task_always_eager = False
