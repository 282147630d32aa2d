"""Signals, log lines and Prometheus metrics: in the worker process (real Celery worker,
receivers that record to the database) and in-process with ``run_due``."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from prometheus_client import REGISTRY

from django_debounce import observe
from django_debounce.backends import get_backend
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.signals import run_finished, run_started, trigger_received
from django_debounce.testing import run_due
from tests.support.helpers import wait_for
from tests.testapp.models import RunLog
from tests.testapp.observed import observed, observed_fail, observed_raising, observed_retry

RUN_KWARGS = {
    "signal",
    "task_name",
    "key",
    "flight_id",
    "run_id",
    "triggers",
    "merged",
    "delay",
    "started_at",
    "attempt",
}


@pytest.fixture
def received():
    """Every signal sent in this process, as (name, sender, kwargs)."""
    seen: list[tuple[str, object, dict]] = []
    receivers = {}
    for name, signal in (
        ("trigger_received", trigger_received),
        ("run_started", run_started),
        ("run_finished", run_finished),
    ):

        def receiver(sender, name=name, **kwargs):
            seen.append((name, sender, kwargs))

        receivers[name] = (signal, receiver)
        signal.connect(receiver)
    yield seen
    for signal, receiver in receivers.values():
        signal.disconnect(receiver)


def later() -> datetime:
    return timezone.now() + timedelta(seconds=1)


def ended_run(**lookup: object) -> DebounceRun:
    """The one ``DebounceRun`` row matching ``lookup`` once it records the run's end (in the
    finish's own transaction, on either store)."""

    def ended() -> DebounceRun | None:
        rows = list(DebounceRun.objects.filter(**lookup))
        assert len(rows) <= 1, rows
        return rows[0] if rows and rows[0].outcome != DebounceRun.Outcome.RUNNING else None

    return wait_for(ended, timeout=30, message=f"the run's end recorded ({lookup})")


def signal_rows(name: str, task: str) -> list[RunLog]:
    return list(RunLog.objects.filter(task=f"signal:{name}", tag=task).order_by("id"))


@pytest.mark.django_db(transaction=True)
def test_signals_in_process_carry_the_documented_arguments(eager, store, received):
    results = [observed.trigger("in-process") for _ in range(3)]
    triggers = [kw for name, _s, kw in received if name == "trigger_received"]
    assert [kw["pending"] for kw in triggers] == [1, 2, 3]
    # eager: nothing is published, so no trigger says its message went out
    assert [kw["scheduled"] for kw in triggers] == [False, False, False]
    assert {kw["key"] for kw in triggers} == {results[0].key}
    assert {kw["flight_id"] for kw in triggers} == {results[0].flight_id}
    assert set(triggers[0]) == {
        "signal",
        "task_name",
        "key",
        "flight_id",
        "pending",
        "due_at",
        "scheduled",
    }
    assert triggers[0]["task_name"] == "testapp.observed"
    # The sender is the task itself (debounced_task returns Celery's proxy of it).
    assert all(sender is observed._get_current_object() for name, sender, _kw in received)

    assert run_due(now=later()) == 1
    started = [kw for name, _s, kw in received if name == "run_started"]
    finished = [kw for name, _s, kw in received if name == "run_finished"]
    assert len(started) == len(finished) == 1
    assert set(started[0]) == RUN_KWARGS
    assert set(finished[0]) == RUN_KWARGS | {"outcome", "error", "duration"}
    run = DebounceRun.objects.get(task_name="testapp.observed")
    for kw in (started[0], finished[0]):
        assert (kw["key"], kw["flight_id"], kw["run_id"]) == (results[0].key, 1, run.run_id)
        assert (kw["triggers"], kw["merged"]) == (3, 2)
        assert kw["delay"] == pytest.approx(run.delay, abs=1e-3)
    assert (finished[0]["outcome"], finished[0]["error"]) == ("success", "")
    assert finished[0]["duration"] >= 0


@pytest.mark.django_db(transaction=True)
def test_trigger_received_waits_for_the_commit(eager, store, received):
    with transaction.atomic():
        assert observed.trigger("atomic").deferred
        assert received == []
    assert [(name, kw["pending"]) for name, _s, kw in received] == [("trigger_received", 1)]
    with transaction.atomic():
        observed.trigger("rolled-back")
        transaction.set_rollback(True)
    assert len(received) == 1  # a rollback leaves no trace, no signal either


@pytest.mark.django_db(transaction=True)
def test_a_failed_run_is_finished_with_its_error_and_logged(eager, store, received, caplog):
    observed_fail.trigger("x")
    with caplog.at_level(logging.DEBUG, logger="django_debounce"):
        with pytest.raises(ValueError, match="boom x"):
            run_due(now=later())
    (finished,) = [kw for name, _s, kw in received if name == "run_finished"]
    assert finished["outcome"] == "failure"
    assert finished["error"] == "ValueError: boom x"
    assert DebounceRun.objects.get(task_name="testapp.observed_fail").outcome == "failure"
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("failure" in r.getMessage() and "boom x" in r.getMessage() for r in failed)


@pytest.mark.django_db(transaction=True)
def test_a_retried_failure_then_the_last_one(eager, store, received):
    observed_retry.trigger("r")
    for _ in range(2):
        with pytest.raises(ValueError, match="again r"):
            run_due(now=later())
    finished = [kw for name, _s, kw in received if name == "run_finished"]
    assert [(kw["outcome"], kw["attempt"]) for kw in finished] == [("retry", 0), ("failure", 1)]
    assert {kw["error"] for kw in finished} == {"ValueError: again r"}
    outcomes = DebounceRun.objects.order_by("run_id").values_list("outcome", flat=True)
    assert list(outcomes) == ["retry", "failure"]


@pytest.mark.django_db(transaction=True)
def test_log_levels(eager, store, caplog):
    with caplog.at_level(logging.DEBUG, logger="django_debounce"):
        observed.trigger("logs")
        observed.trigger("logs")
        run_due(now=later())
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "django_debounce"]
    debug = [m for level, m in lines if level == logging.DEBUG and "trigger" in m]
    info = [m for level, m in lines if level == logging.INFO]
    assert len(debug) == 2 and "opened" in debug[0] and "merged" in debug[1]
    assert any("started: 2 trigger(s), 1 merged" in m for m in info)
    assert any("success" in m for m in info)
    assert not [m for level, m in lines if level >= logging.WARNING]


@pytest.mark.django_db(transaction=True)
def test_a_raising_receiver_breaks_neither_the_trigger_nor_the_run(eager, store, caplog):
    with caplog.at_level(logging.ERROR, logger="django_debounce"):
        for _ in range(4):
            observed_raising.trigger("r")  # the receiver raises on every signal
        assert run_due(now=later()) == 1
    row = DebounceKey.objects.get(task_name="testapp.observed_raising")
    live = get_backend().live_state(row.key_hash)
    assert (live["runs"], live["merged"], live["pending"], live["state"]) == (1, 3, 0, "idle")
    assert DebounceRun.objects.get(debounce_key=row).outcome == "success"
    assert RunLog.objects.get(task="testapp.observed_raising").triggers == 4
    raised = [
        r.getMessage()
        for r in caplog.records
        if r.name == "django_debounce" and "a broken receiver" in r.getMessage()
    ]
    assert len(raised) == 4 + 2  # four triggers, one run started and finished


def sample(name: str, task: str) -> float:
    return REGISTRY.get_sample_value(name, {"task": task}) or 0.0


@pytest.mark.django_db(transaction=True)
def test_prometheus_metrics_labelled_by_task(eager, store):
    task = "testapp.observed"
    before = {
        name: sample(name, task)
        for name in (
            "django_debounce_triggers_total",
            "django_debounce_runs_total",
            "django_debounce_merged_triggers_total",
            "django_debounce_trigger_to_start_delay_seconds_count",
        )
    }
    for _ in range(5):
        observed.trigger("metrics")
    observed.trigger("metrics-2")
    assert run_due(now=later()) == 2
    after = {name: sample(name, task) for name in before}
    assert after["django_debounce_triggers_total"] - before["django_debounce_triggers_total"] == 6
    assert after["django_debounce_runs_total"] - before["django_debounce_runs_total"] == 2
    merged = "django_debounce_merged_triggers_total"
    assert after[merged] - before[merged] == 4
    count = "django_debounce_trigger_to_start_delay_seconds_count"
    assert after[count] - before[count] == 2
    failures = sample("django_debounce_run_failures_total", "testapp.observed_fail")
    observed_fail.trigger("metrics")
    with pytest.raises(ValueError):
        run_due(now=later())
    assert sample("django_debounce_run_failures_total", "testapp.observed_fail") == failures + 1


@pytest.mark.django_db(transaction=True)
def test_without_prometheus_client_nothing_is_counted_and_nothing_breaks(
    eager, store, monkeypatch, received
):
    monkeypatch.setattr(observe, "metrics", None)
    before = sample("django_debounce_triggers_total", "testapp.observed")
    observed.trigger("no-metrics")
    assert run_due(now=later()) == 1
    assert sample("django_debounce_triggers_total", "testapp.observed") == before
    assert [name for name, _s, _kw in received] == [
        "trigger_received",
        "run_started",
        "run_finished",
    ]


@pytest.mark.worker
def test_worker_sends_run_signals_with_the_documented_arguments(worker, unique_tag):
    results = [observed.trigger(unique_tag) for _ in range(5)]
    key = results[0].key
    wait_for(
        lambda: RunLog.objects.filter(task="signal:run_finished", key=key).exists(),
        timeout=30,
        message="run_finished from the worker",
    )
    (body,) = RunLog.objects.filter(task="testapp.observed", key=key)
    (started,) = RunLog.objects.filter(task="signal:run_started", key=key)
    (finished,) = RunLog.objects.filter(task="signal:run_finished", key=key)
    triggered = RunLog.objects.filter(task="signal:trigger_received", key=key).order_by("id")
    assert [r.payload["pending"] for r in triggered] == [1, 2, 3, 4, 5]
    # run_* are sent in the worker process that ran the body, around it.
    assert started.pid == finished.pid == body.pid
    assert started.id < body.id < finished.id
    run = ended_run(debounce_key__key=key)
    assert run.outcome == "success"
    for row in (started, finished):
        p = row.payload
        assert set(p) == RUN_KWARGS - {"signal"} | (
            {"outcome", "error", "duration"} if row is finished else set()
        )
        assert (p["task_name"], p["key"], p["flight_id"], p["run_id"]) == (
            "testapp.observed",
            key,
            results[0].flight_id,
            run.run_id,
        )
        assert (p["triggers"], p["merged"]) == (5, 4)
        assert p["delay"] == pytest.approx(run.delay, abs=1e-3)
        assert p["delay"] >= 0.2 - 1e-3  # the quiet period (I3)
    assert (finished.payload["outcome"], finished.payload["error"]) == ("success", "")


@pytest.mark.worker
def test_a_runs_outcome_is_recorded_before_its_finish_is_reported(worker, unique_tag):
    """The records never lag a run (issue 22): by the time the worker reports the run
    finished (``run_finished``, sent right after the store's finish in the same process), its
    ``DebounceRun`` row holds the outcome and its key row shows it idle, on either store."""
    key = observed.trigger(unique_tag).key
    seen = wait_for(
        lambda: RunLog.objects.filter(task="records-at-finish", key=key).first(),
        timeout=30,
        message="run_finished from the worker",
    )
    assert seen.payload == {"run": "success", "key": "idle"}


@pytest.mark.worker
def test_worker_run_finished_reports_a_failure(worker, unique_tag):
    result = observed_fail.trigger(unique_tag)
    row = wait_for(
        lambda: RunLog.objects.filter(task="signal:run_finished", key=result.key).first(),
        timeout=30,
        message="run_finished of the failing run",
    )
    assert row.payload["outcome"] == "failure"
    assert row.payload["error"] == f"ValueError: boom {unique_tag}"
    assert ended_run(debounce_key__key=result.key).outcome == "failure"


@pytest.mark.worker
def test_worker_bookkeeping_survives_a_raising_receiver(worker, unique_tag):
    for _ in range(3):
        observed_raising.trigger(unique_tag)
    wait_for(
        lambda: RunLog.objects.filter(task="testapp.observed_raising", tag=unique_tag).exists(),
        timeout=30,
        message="the run despite a broken receiver",
    )
    row = DebounceKey.objects.get(task_name="testapp.observed_raising")

    def recorded() -> bool:
        live = get_backend().live_state(row.key_hash)
        return live is not None and live["state"] == "idle" and live["runs"] == 1

    wait_for(recorded, timeout=30, message="the run recorded as finished")
    live = get_backend().live_state(row.key_hash)
    assert (live["merged"], live["pending"]) == (2, 0)
    assert ended_run(debounce_key=row).outcome == "success"
