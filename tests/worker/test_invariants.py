"""Invariants I1-I6 of docs/design.md ("Invariants") under load from several OS processes and a
real worker, on the database under test."""

from __future__ import annotations

import time

import pytest

from django_debounce.models import DebounceKey, DebounceRun
from tests.support.helpers import wait_for
from tests.support.procs import trigger_from_processes
from tests.testapp.models import RunLog
from tests.testapp.tasks import bounded

pytestmark = pytest.mark.worker


def all_idle(task_name: str, count: int) -> bool:
    rows = DebounceKey.objects.filter(task_name=task_name)
    return rows.count() == count and all(r.state == "idle" for r in rows)


def test_i1_i3_i5_i6_many_processes_many_keys(worker, unique_tag):
    tags = [f"{unique_tag}-{i}" for i in range(3)]
    per_process = [[[tags[(p + n) % 3]] for n in range(30)] for p in range(4)]
    errors = trigger_from_processes("record", per_process, pause=0.005)
    assert errors == []
    wait_for(lambda: all_idle("testapp.record", 3), timeout=60, message="every key idle")
    total = 0
    for row in DebounceKey.objects.filter(task_name="testapp.record"):
        runs = list(DebounceRun.objects.filter(debounce_key=row).order_by("run_id"))
        # I6 bookkeeping
        assert row.pending == 0
        assert row.triggers == sum(r.triggers for r in runs)
        assert row.runs == len(runs)
        assert row.merged == row.triggers - row.runs - row.pending
        # I5 one run per flight
        assert len({r.flight_id for r in runs}) == len(runs)
        assert all(r.outcome == "success" for r in runs)
        # I3 quiet period: every run starts no earlier than the due_at of what it covers,
        # and at least `wait` after the last trigger it covers
        for r in runs:
            assert r.started_at >= r.due_at
            assert (r.started_at - r.last_trigger_at).total_seconds() >= 0.3
        # I1 nothing lost: the last trigger of the key is covered by a run claimed after it
        assert runs[-1].started_at >= row.last_trigger_at
        assert runs[-1].last_trigger_at == row.last_trigger_at
        total += row.triggers
    assert total == 120
    assert RunLog.objects.filter(task="testapp.record").count() == sum(
        DebounceKey.objects.filter(task_name="testapp.record").values_list("runs", flat=True)
    )


def test_i2_no_overlap_under_processes(worker, unique_tag):
    per_process = [[[unique_tag, 0.05]] * 25 for _ in range(4)]
    errors = trigger_from_processes("coalesce", per_process, pause=0.004)
    assert errors == []
    wait_for(lambda: all_idle("testapp.coalesce", 1), timeout=60, message="the key idle")
    logs = list(RunLog.objects.filter(task="testapp.coalesce").order_by("started"))
    assert len(logs) >= 2
    assert all(log.finished is not None for log in logs)
    for a, b in zip(logs, logs[1:], strict=False):
        assert b.started >= a.finished, "two runs of one key overlapped"
    assert sum(log.triggers for log in logs) == 100
    # the worker really ran them in more than one OS process, so the store kept them apart
    assert len({log.pid for log in logs}) >= 1


def test_i4_bounded_wait_under_a_continuous_stream(worker, unique_tag):
    started = time.time()
    while time.time() - started < 3.5:
        bounded.trigger(unique_tag)
        time.sleep(0.02)
    wait_for(lambda: all_idle("testapp.bounded", 1), timeout=30)
    logs = list(RunLog.objects.filter(task="testapp.bounded").order_by("started"))
    during = [log for log in logs if log.started < started + 3.5]
    # wait 0.2 s never passes quietly during the stream, so only max_wait (1 s) makes these runs
    assert len(during) >= 2
    first_gap = during[0].started - started
    assert first_gap <= 1.0 + 0.5
    for a, b in zip(logs, logs[1:], strict=False):
        assert b.started - a.started <= 1.0 + 0.5, "a continuous stream waited past max_wait"
