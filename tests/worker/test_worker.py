"""What django-debounce adds to a Celery worker, with real worker processes
(docs/design.md, "Dispatch at scale"): the pump in the worker's main process (not in pool
children, not in the consumer's thread), stopped on a warm shutdown, turned off with
``DEBOUNCE_PUMP=False`` and run on its own by ``manage.py debounce_pump``; the lease keeper
keeping alive the lease of a body that holds the GIL; several hosts, one killed whole
mid-batch and mid-run; and a worker that starts consuming at once with 100,000 pending keys
in the index."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest
from django.db import connection
from django.test import override_settings

from django_debounce.backends import get_backend
from django_debounce.keys import dumps, key_hash
from django_debounce.models import DebounceDue, DebounceKey, DebounceRun
from tests.celery_app import app
from tests.support.helpers import ROOT, stays, wait_for
from tests.support.peek import peek_store
from tests.support.workers import Worker
from tests.testapp.models import RunLog
from tests.testapp.tasks import gil_holder, hosts, lodash_debounce, record, record_slow

pytestmark = pytest.mark.worker

PUMP = "django-debounce pump"


def flight(task, tag: str) -> dict | None:
    """The store's state of ``task``'s key for ``tag`` (the row, with what its Redis counter
    counted folded in)."""
    h = key_hash(task.name, task.resolve((tag,), {})[0])
    return peek_store(get_backend(), h)


@pytest.fixture
def alone(celery_worker_session, transactional_db):
    """No other worker (so no other pump) runs during the test: the session worker is stopped
    and started again after it."""
    celery_worker_session.stop()
    try:
        yield
    finally:
        celery_worker_session.start()


def inspect(worker: Worker, command: str) -> dict:
    node = f"{worker.name}-{os.getpid()}@localhost"
    replies = wait_for(
        lambda: app.control.inspect(destination=[node], timeout=2.0)._request(command),
        timeout=20,
        interval=0.5,
        message=f"{node} to answer {command}",
    )
    return replies[node]


def test_the_pump_runs_in_the_main_process_and_stops_on_a_warm_shutdown(alone, store, unique_tag):
    worker = Worker(concurrency=2, name="pump-main")
    worker.start()
    try:
        # the main process: a thread of its own, not the consumer's (which answers this)
        main = inspect(worker, "test_threads")
        assert main["pid"] == worker.proc.pid
        assert PUMP in main["threads"] and main["current"] != PUMP
        assert main["threads"].count(PUMP) == 1
        stats = inspect(worker, "debounce_stats")
        assert stats["pump"] is True and stats["ticks"] >= 1
        # a pool child: no pump there
        record_threads = app.tasks["testapp.threads"]
        record_threads.trigger(unique_tag)
        child = wait_for(
            lambda: RunLog.objects.filter(task="testapp.threads", tag=unique_tag).first(),
            message="a run in a pool child",
        )
        assert child.pid != worker.proc.pid and child.payload["ppid"] == worker.proc.pid
        assert PUMP not in child.payload["threads"]
        # the pump publishes what is due (the flight waits in the index: due in 1.6 s)
        lodash_debounce.trigger(f"{unique_tag}-due")
        wait_for(
            lambda: RunLog.objects.filter(tag=f"{unique_tag}-due", finished__isnull=False).exists(),
            message="the pump to publish a flight from the index",
        )
        # warm shutdown while a run goes on: the run finishes, the pump stops at once
        record.trigger(f"{unique_tag}-long", 4.0)
        wait_for(lambda: RunLog.objects.filter(tag=f"{unique_tag}-long").exists())
        os.kill(worker.proc.pid, signal.SIGTERM)  # the main process only: a warm shutdown
        lodash_debounce.trigger(f"{unique_tag}-after")  # due 1.6 s later, during the shutdown
        stopping = time.monotonic()
        worker.proc.wait(timeout=30)
        assert time.monotonic() - stopping >= 1.6 + 0.5  # the 4 s run was let finish
        assert RunLog.objects.get(tag=f"{unique_tag}-long").finished is not None
        after = flight(lodash_debounce, f"{unique_tag}-after")
        assert after["pending"] == 1 and not after["taken"], "a stopping worker's pump published"
    finally:
        worker.stop()

    # DEBOUNCE_PUMP=False: this worker publishes nothing; another pump does
    quiet = Worker(concurrency=2, name="pump-off", env={"DEBOUNCE_TEST_PUMP": "0"})
    quiet.start()
    try:
        assert inspect(quiet, "debounce_stats")["pump"] is False
        assert PUMP not in inspect(quiet, "test_threads")["threads"]
        assert stays(
            lambda: not flight(lodash_debounce, f"{unique_tag}-after")["taken"], duration=3
        )
        out = subprocess.run(
            # manage.py debounce_pump --once, in a process that imports the Celery app (as
            # a project's package __init__ does)
            [
                sys.executable,
                "-c",
                "import django; django.setup(); import tests.celery_app; "
                "from django.core.management import call_command; "
                "call_command('debounce_pump', '--once')",
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "DEBOUNCE_TEST_WORKER": "1",
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DEBOUNCE_TEST_BACKEND": "auto",
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "published 1 message(s)" in out.stdout, out.stdout + out.stderr
        run = wait_for(
            lambda: RunLog.objects.filter(
                tag=f"{unique_tag}-after", finished__isnull=False
            ).first(),
            message="the run the standalone pump published",
        )
        assert run.triggers == 1
    finally:
        quiet.stop()


def test_the_lease_keeper_keeps_a_gil_holding_run_alive(alone, store, unique_tag):
    """A body that holds the GIL (a C loop) for about 4 leases: the lease keeper in the main
    process extends its lease, so it is never counted lost, redone or overlapped."""
    lease = gil_holder.flight_options().lease
    assert lease == 1.5
    worker = Worker(concurrency=2, name="keeper")
    worker.start()
    try:
        gil_holder.trigger(unique_tag, 4 * lease)
        first = wait_for(lambda: RunLog.objects.filter(tag=unique_tag).first())
        gil_holder.trigger(unique_tag, 0.1)  # waits for the live run (no overlap)
        runs = wait_for(
            lambda: (
                [
                    r
                    for r in RunLog.objects.filter(tag=unique_tag).order_by("started")
                    if r.finished is not None
                ]
                if RunLog.objects.filter(tag=unique_tag, finished__isnull=False).count() == 2
                else None
            ),
            timeout=60,
            message="the long run and the one after it",
        )
        assert runs[0].pk == first.pk
        assert runs[0].finished - runs[0].started > 2 * lease  # it held its lease past it
        assert runs[1].started >= runs[0].finished, list(  # I2
            DebounceRun.objects.values_list("run_id", "outcome", "started_at", "finished_at")
        )
        assert (runs[0].triggers, runs[1].triggers) == (1, 1)
        assert stays(lambda: RunLog.objects.filter(tag=unique_tag).count() == 2, duration=1.0)
        wait_for(
            lambda: (
                DebounceRun.objects.filter(task_name="testapp.gil_holder").count() == 2
                and not DebounceRun.objects.filter(outcome="running").exists()
            ),
            timeout=15,
        )
        assert set(DebounceRun.objects.values_list("outcome", flat=True)) == {"success"}
    finally:
        worker.stop()


def test_three_hosts_one_killed_whole_mid_batch_and_mid_run(alone, store, unique_tag):
    """Three workers (distinct node names), each pumping and running, lease 10 s. One is
    killed whole (its process group: main process and pool) while it runs bodies and holds
    prefetched messages. Within the lease and two pump ticks every trigger is covered by a
    finished run that started after it; no flight ran twice; no two runs of a key overlap."""
    grace = 4.0
    env = {"DEBOUNCE_TEST_DISPATCH_GRACE": str(grace)}
    workers = [Worker(concurrency=2, name=f"host{i}", env=env) for i in range(3)]
    for w in workers:
        w.start()
    tags = [f"{unique_tag}-{i}" for i in range(12)]
    triggers: dict[str, list[float]] = {tag: [] for tag in tags}
    try:
        # This machine's latency now: from a trigger's due time to its run's start (a loaded
        # machine is late everywhere; the bound below allows four times it).
        probe = f"{unique_tag}-latency"
        before = time.time()
        hosts.trigger(probe)
        started = wait_for(
            lambda: RunLog.objects.filter(tag=probe).values_list("started", flat=True).first(),
            message="the latency probe's run",
        )
        latency = max(started - (before + 0.2), 0.0)  # hosts: wait 0.2 s
        with override_settings(DEBOUNCE_DISPATCH_GRACE=grace):
            killed_at = None
            for round_ in range(8):
                for tag in tags:
                    hosts.trigger(tag, 1.5)
                    triggers[tag].append(time.time())
                if round_ == 4:
                    # kill the host that is running the most bodies right now
                    busy = {
                        log.pid
                        for log in RunLog.objects.filter(task="testapp.hosts", finished=None)
                    }
                    victim = max(
                        workers,
                        key=lambda w: sum(1 for pid in busy if _parent(pid) == w.proc.pid),
                    )
                    victim.kill()
                    killed_at = time.time()
                time.sleep(0.25)
        assert killed_at is not None
        last = max(max(times) for times in triggers.values())
        # + the body + dispatch, + four times the latency measured
        deadline_at = max(killed_at + 10 + 2, last) + 1.5 + 3 + 4 * latency
        for tag, times in triggers.items():
            wait_for(
                lambda tag=tag, at=times[-1]: RunLog.objects.filter(
                    tag=tag, started__gte=at, finished__isnull=False
                ).exists(),
                timeout=max(deadline_at - time.time(), 1),
                message=f"a finished run of {tag} after its last trigger (latency {latency:.2f} s)",
            )
        assert time.time() <= deadline_at + 1
        for tag, times in triggers.items():
            runs = list(RunLog.objects.filter(tag=tag).order_by("started"))
            done = [r for r in runs if r.finished is not None]
            for at in times:  # I1: each trigger covered by a finished run started after it
                assert any(r.started >= at for r in done), (tag, at)
            flights = [r.flight_id for r in done]
            assert len(flights) == len(set(flights)), f"{tag}: a flight ran twice: {flights}"
            for a, b in zip(runs, runs[1:], strict=False):  # I2
                end = a.finished if a.finished is not None else killed_at
                assert b.started >= end, f"{tag}: runs overlapped"
        assert any(r.finished is None for r in RunLog.objects.filter(task="testapp.hosts")), (
            "the killed host was running nothing: the test did not test a run killed mid-body"
        )
    finally:
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                w.stop()


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def rows_read() -> int:
    """Rows PostgreSQL has read from the key and due tables, by every session (sequential
    and index reads), this session's own counts flushed first."""
    tables = [DebounceKey._meta.db_table, DebounceDue._meta.db_table]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0) "
            "FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [tables],
        )
        return int(cursor.fetchone()[0])


def other_sessions() -> int:
    """Sessions on this database besides this one."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_a_worker_with_100000_pending_keys_runs_a_new_key_before_any_of_them(alone, unique_tag):
    """The pump looks at what is due, not at every pending key: a worker started with
    100,000 flights waiting in the index runs a new key's flight while the 100,000 wait
    untouched, and (PostgreSQL) reads a few rows of the tables, not 100,000 (how soon is
    the scale benchmark's figure: ``scripts/bench scale``)."""
    # filled through the store with an hour's wait, so none is due however long filling
    # takes (each opens a flight: one row and one index entry per key)
    items = []
    for i in range(100_000):
        key = record_slow.resolve((f"{unique_tag}-{i}",), {})[0]
        items.append((key, key_hash(record_slow.name, key), dumps([f"{unique_tag}-{i}"])))
    hour = dataclasses.replace(record_slow.flight_options(), wait=3600.0)
    started = time.monotonic()
    results = get_backend().trigger_many(task_name=record_slow.name, items=items, options=hour)
    filled = time.monotonic() - started
    print(f"\n100,000 new keys filled in {filled:.1f} s")
    assert len(results) == 100_000 and all(r.pending == 1 for r, _d in results)
    stats = get_backend().index_stats([record_slow.name])[record_slow.name]
    assert stats.depth == 100_000 and stats.due == 0
    pg = connection.vendor == "postgresql"
    before = rows_read() if pg else 0
    worker = Worker(concurrency=2, name="busy-index")
    started = time.monotonic()
    worker.start()
    try:
        record.trigger(unique_tag)
        probe = time.monotonic()
        wait_for(
            lambda: RunLog.objects.filter(tag=unique_tag, finished__isnull=False).exists(),
            timeout=60,
            message="the probe key's run",
        )
        print(f"worker started and ran the probe in {time.monotonic() - started:.1f} s "
              f"(the probe: {time.monotonic() - probe:.1f} s)")  # fmt: skip
    finally:
        worker.stop()
    if pg:  # the worker's sessions have ended: their counts are flushed
        wait_for(lambda: not other_sessions(), message="the worker's sessions to end")
        read = rows_read() - before
        print(f"rows read by the worker: {read}")
        assert read < 10_000, f"the worker read {read} rows of 100,000 pending keys"
    waiting = DebounceKey.objects.filter(task_name=record_slow.name)
    assert waiting.filter(state="pending", pending=1, runs=0).count() == 100_000
    stats = get_backend().index_stats([record_slow.name])[record_slow.name]
    assert stats.depth == 100_000 and stats.due == 0
