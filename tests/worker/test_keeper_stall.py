"""The lease keeper after the worker's main process stalls (issue 21), with real worker
processes: the main process is stopped (SIGSTOP) for about a lease, its pool processes are not.

A debounced run that ends while the main process is stopped still looks active when it
resumes (the main process has not read its result yet), and its lease's deadline has passed.
The keeper must not stop the pool process that ran it: it may already run the next task, a
plain Celery task that would be lost with no error and no retry. The keeper stops a pool
process only while the very run it protects still runs there, checked when it acts; and when
it does stop one, Celery records that task as failed (``WorkerLostError``), not revoked.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_debounce.models import DebounceRun
from tests.support.helpers import wait_for
from tests.support.workers import Worker
from tests.testapp.models import RunLog
from tests.testapp.tasks import OUTCOMES, plain, stalled

pytestmark = pytest.mark.worker

LEASE = 3.0
QUEUE = "debounce-tests"
STORES = ("redis", "database")

# (stall seconds, whether one run outlasts the stall). A run that outlasts a stall needs its
# lease extended after it: that stall stays under two thirds of the lease (the keeper extends
# every third of it), so the lease has not ended when the main process resumes. Runs end
# during the longer stalls: under the lease, at it and over it.
ROUND = [
    (1.0, True),
    (2.0, False),
    (3.0, False),
    (1.4, True),
    (2.5, False),
    (3.5, False),
    (1.5, False),
    (4.0, False),
]
PLAN = ROUND * 3  # 24 stalls


@pytest.fixture
def alone(celery_worker_session, transactional_db):
    """No other worker (so no other pump or keeper) runs during the test: the session worker
    is stopped and started again after it."""
    celery_worker_session.stop()
    try:
        yield
    finally:
        celery_worker_session.start()


def children(pid: int) -> set[int]:
    """The pids of the live child processes of ``pid`` (the pool processes of a worker)."""
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(name))
    return out


def outcomes() -> list[dict]:
    """What Celery recorded in the worker's main process (``task_failure``/``task_revoked``)
    for ``testapp.stalled`` and ``testapp.plain`` tasks."""
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    try:
        return [json.loads(raw) for raw in client.lrange(OUTCOMES, 0, -1)]
    finally:
        client.close()


def stall(worker: Worker, seconds: float) -> None:
    """Stop the worker's main process (not its pool) for ``seconds``."""
    assert worker.proc is not None
    os.kill(worker.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the stall itself
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)


def test_stalls_of_the_main_process_lose_no_task_and_overlap_no_run(alone, broker, unique_tag):
    """24 stalls of the main process, from a third of the lease to more than it, each while
    two debounced runs are in their bodies and plain tasks wait behind them. No plain task is
    lost, no run is stopped, no pool process is killed, no two runs of a key overlap."""
    assert stalled.flight_options().lease == LEASE
    worker = Worker(concurrency=2, name="keeper-stall")
    worker.start()
    assert worker.proc is not None
    started = time.monotonic()
    sent: list[str] = []  # the plain tasks' tags
    keys: list[str] = []  # the debounced runs' tags
    late: list[str] = []
    protected: list[str] = []  # the runs that outlast a stall: the keeper must keep them
    try:
        pool = children(worker.proc.pid)
        assert len(pool) == 2
        for i, (seconds, outlasts) in enumerate(PLAN):
            store = STORES[i % 2]
            with override_settings(DEBOUNCE_BACKEND=store):
                tags = [f"{unique_tag}-{i}-{j}" for j in range(2)]
                bodies = [seconds + 1.5 if outlasts else 0.5, 0.5]
                for tag, body in zip(tags, bodies, strict=True):
                    stalled.trigger(tag, body)
                keys += tags
                # both runs are in their bodies
                wait_for(
                    lambda tags=tags: RunLog.objects.filter(tag__in=tags).count() == 2,
                    timeout=20,
                    message=f"round {i}: both runs to start",
                )
                waiting = [f"{unique_tag}-{i}-plain-{j}" for j in range(4)]
                for tag in waiting:
                    plain.delay(tag, 0.2)
                sent += waiting
                # the main process holds two of them (prefetch) when it stops
                wait_for(
                    lambda: broker.llen(QUEUE) <= 2,
                    timeout=20,
                    message=f"round {i}: the worker to take plain tasks",
                )
                stall(worker, seconds)
                done = [*tags, *waiting]
                try:
                    wait_for(
                        lambda done=done: (
                            RunLog.objects.filter(tag__in=done, finished__isnull=False).count()
                            == len(done)
                        ),
                        timeout=15,
                        message=f"round {i} (stall {seconds}s, {store}) to finish",
                    )
                except AssertionError:
                    late.append(f"round {i} (stall {seconds}s, {store})")
                if outlasts:
                    protected.append(tags[0])
        # the worker (the only pump) redoes a run the store recorded lost: every key's last
        # run has succeeded before it stops
        history = DebounceRun.objects.filter(
            task_name="testapp.stalled",
            debounce_key__key__in=RunLog.objects.filter(tag__in=keys).values("key"),
        )
        wait_for(
            lambda: (
                not history.filter(outcome="running").exists()
                and history.filter(outcome="success").count() == len(keys)
            ),
            timeout=30,
            message="every key's last run to succeed",
        )
        survivors = children(worker.proc.pid)
    finally:
        worker.stop()
    elapsed = time.monotonic() - started

    finished = set(
        RunLog.objects.filter(task="testapp.plain", finished__isnull=False).values_list(
            "tag", flat=True
        )
    )
    lost = [tag for tag in sent if tag not in finished]
    assert not lost, f"{len(lost)} of {len(sent)} plain tasks lost ({late}): {lost}"

    # A pool process is killed only while it runs a debounced body (none here: every run
    # kept its lease or ended before the main process resumed).
    rows = list(RunLog.objects.filter(tag__startswith=unique_tag).order_by("started"))
    killed = {row.pid for row in rows} - survivors
    assert not killed, [
        (row.task, row.tag, row.pid, row.finished is not None) for row in rows if row.pid in killed
    ]
    assert not [o for o in outcomes() if o["outcome"] in ("failure", "revoked")], outcomes()

    # Every key ran, each run ended, no two runs of a key overlap (I2).
    runs = [row for row in rows if row.task == "testapp.stalled"]
    by_key: dict[str, list[RunLog]] = {}
    for row in runs:
        by_key.setdefault(row.tag, []).append(row)
    assert sorted(by_key) == sorted(keys)
    for tag, key_runs in by_key.items():
        assert all(run.finished is not None for run in key_runs), tag
        for before, after in zip(key_runs, key_runs[1:], strict=False):
            assert after.started >= before.finished, (tag, before.pk, after.pk)
    # A key runs once, unless the store recorded its run as lost (its finish came after its
    # lease: on a loaded machine a body that ended in a stall can finish late, and the redo is
    # the designed recovery, I7); then it runs again after it, and its last run succeeds. A
    # run that outlasts a stall keeps its lease (the keeper renews it): it runs once.
    outcome: dict[str, dict[int, str]] = {}
    for key, run_id, out in history.values_list("debounce_key__key", "run_id", "outcome"):
        outcome.setdefault(key, {})[run_id] = out
    assert len(outcome) == len(keys)
    for tag, key_runs in by_key.items():
        recorded = outcome[key_runs[0].key]
        got = [recorded[run_id] for run_id in sorted(recorded)]
        assert got == ["lost"] * (len(got) - 1) + ["success"], (tag, got)
        assert {run.run_id for run in key_runs} <= set(recorded), tag
        assert key_runs[-1].run_id == max(recorded), tag
        if tag in protected:
            assert got == ["success"] and len(key_runs) == 1, (tag, got)
    print(f"{len(PLAN)} stalls, {len(sent)} plain tasks, {len(keys)} runs in {elapsed:.1f}s")


STOPPED = re.compile(r"django_debounce: stopped testapp\.stalled\[(?P<id>[0-9a-f-]{36})\]")


def test_a_run_whose_lease_ends_in_a_stall_is_stopped_and_recorded_as_failed(
    alone, store, unique_tag
):
    """The main process stops for longer than the lease while a run is in its body: the store
    says its lease ran out, so the keeper stops it when the main process resumes (its body
    never ends), logs why, and Celery records the task as failed (``WorkerLostError``), not
    revoked; the flight is redone."""
    worker = Worker(concurrency=2, name="keeper-stop")
    worker.start()
    assert worker.proc is not None
    try:
        pool = children(worker.proc.pid)
        stalled.trigger(unique_tag, 60.0)
        first = wait_for(lambda: RunLog.objects.filter(tag=unique_tag).first())
        assert first.pid in pool
        stall(worker, LEASE + 1.5)
        redo = wait_for(
            lambda: RunLog.objects.filter(tag=unique_tag, finished__isnull=False).first(),
            timeout=30,
            message="the redo of the stopped run",
        )
        log = worker.log.read_text()
        # (the test settings log django_debounce's records twice: Celery's line is this one;
        # the log file has the lines of every start of this worker in the session)
        lines = [
            line
            for line in log.splitlines()
            if STOPPED.search(line) and "ERROR/" in line and unique_tag in line
        ]
        assert len(lines) == 1, lines
        line = lines[0]
        request_id = STOPPED.search(line)["id"]
        assert "the store says its lease was lost" in line, line
        failed = wait_for(
            lambda: [o for o in outcomes() if o["id"] == request_id],
            message="Celery's outcome of the stopped task",
        )
        assert [(o["outcome"], o["exception"]) for o in failed] == [("failure", "WorkerLostError")]
        log = worker.log.read_text()
        # Celery's failure comes after the keeper's line
        assert "raised error: WorkerLostError('Worker exited" in log[log.index(line) :]
    finally:
        worker.stop()
    first.refresh_from_db()
    assert first.finished is None  # stopped in its body
    assert redo.pk != first.pk and redo.pid != first.pid
    assert DebounceRun.objects.filter(task_name="testapp.stalled").count() >= 1
