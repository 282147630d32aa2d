"""debounce_purge and debounce_status, run as an operator would."""

from __future__ import annotations

import dataclasses
import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_debounce import durations
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.testing import run_due
from tests.celery_app import app
from tests.support.helpers import wait_for
from tests.support.private_tasks import private_task
from tests.testapp.tasks import record, record_slow


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("45s", 45),
        ("30m", 1800),
        ("12h", 43200),
        ("7d", 604800),
        ("2w", 1209600),
        ("01:00:00", 3600),
    ],
)
def test_durations(text, seconds):
    assert durations.parse(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("bad", ["", "7 dayz", "-1d", "soon", "3y"])
def test_bad_duration_is_a_command_error_naming_the_form(bad, db):
    with pytest.raises(CommandError, match="45s, 30m, 12h, 7d"):
        run("debounce_purge", f"--older-than={bad}")


@pytest.mark.parametrize("bad", ["25:61:61", "00:00:60", "10:60:00", "61:61", "1 25:00:00"])
def test_a_clock_field_out_of_range_is_refused_naming_the_forms(bad, db):
    """Django's parse_duration adds the fields up unchecked (``25:61:61`` would purge what is
    older than 1 day 2:02:01): a minute or second past 59, or an hour past 23 after days, is
    a typo, refused with the accepted forms."""
    with pytest.raises(
        CommandError, match=r"run from 00 to 59.*45s, 30m, 12h, 7d, 2w\), or HH:MM:SS"
    ):
        run("debounce_purge", "--older-than", bad, "--dry-run")


@pytest.mark.parametrize(
    "text, expected",
    [("25:00:00", timedelta(hours=25)), ("1 23:59:59", timedelta(days=1, seconds=86399))],
)
def test_a_clock_in_range_is_still_accepted(text, expected):
    assert durations.parse(text) == expected


def test_bare_number_is_refused_rather_than_read_as_seconds(db):
    with pytest.raises(CommandError, match="no unit: write 7d for days"):
        run("debounce_purge", "--older-than", "7")


def test_unknown_task_is_a_command_error(db):
    with pytest.raises(CommandError, match="registered debounced task"):
        run("debounce_purge", "--older-than", "7d", "--task", "nope.missing")


@pytest.mark.django_db(transaction=True)
def test_purge_deletes_only_stale_idle_keys_and_old_runs(eager, store):
    record.trigger("old")
    record.trigger("new")
    record_slow.trigger("pending")
    assert run_due(now=timezone.now() + timedelta(seconds=1)) == 2
    old = DebounceKey.objects.get(key__contains='"old"')
    DebounceKey.objects.filter(pk=old.pk).update(updated_at=timezone.now() - timedelta(days=8))
    DebounceRun.objects.filter(debounce_key=old).update(
        started_at=timezone.now() - timedelta(days=8)
    )
    dry = run("debounce_purge", "--older-than", "7d", "--dry-run")
    assert "would delete 1 idle keys and 1 runs" in dry
    assert DebounceKey.objects.count() == 3
    out = run("debounce_purge", "--older-than", "7d", "--batch-size", "1")
    assert "deleted 1 idle keys and 1 runs" in out
    assert set(DebounceKey.objects.values_list("key", flat=True)) == {
        record.resolve(("new",), {})[0],
        record_slow.resolve(("pending",), {})[0],
    }
    assert DebounceRun.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_purge_redoes_a_run_whose_lease_ran_out(eager, store):
    from django_debounce.backends import get_backend

    # A task no worker knows: the pump of a worker would redo the lost run before the purge.
    with private_task("tests.purge_lost", wait=0.3) as task:
        task.trigger("lost")
        row = DebounceKey.objects.get()
        soon = timezone.now() + timedelta(seconds=0.5)  # past the 0.3 s wait
        options = dataclasses.replace(task.flight_options(), lease=0.01)
        decision = get_backend().fire(
            row.key_hash, None, task_name=task.name, options=options, now=soon
        )
        assert decision.claim is not None  # claimed, then its worker "dies": no finish

        def purged_back_to_pending() -> bool:
            run("debounce_purge", "--older-than", "7d")
            return get_backend().live_state(row.key_hash)["state"] == "pending"

        wait_for(purged_back_to_pending, timeout=10, interval=0.1, message="the lost run redone")
        assert get_backend().live_state(row.key_hash)["pending"] == 1
        assert DebounceRun.objects.get().outcome == "lost"  # the purge wrote the record
        assert task.ran == []


@pytest.mark.django_db(transaction=True)
def test_status_lists_pending_keys_with_live_counts(eager, store):
    for _ in range(3):
        record_slow.trigger("s")
    assert "pending" in run("debounce_status")
    lines = [json.loads(line) for line in run("debounce_status", "--json").splitlines()]
    assert [(r["task"], r["pending"], r["state"]) for r in lines] == [
        ("testapp.record_slow", 3, "pending")
    ]
    assert (
        run("debounce_status", "--task", "testapp.record_other") == "no pending or running keys\n"
    )
    record_slow.trigger("t" * 80)
    short = run("debounce_status", "--limit", "1")
    assert "raise --limit to see them" in short
    assert "raise --limit" not in run("debounce_status", "--limit", "2")
    assert "…" in run("debounce_status")  # a long key is cut visibly
    with private_task("tests." + "n" * 200, wait=3600) as long_named:
        long_named.trigger("u")
        table = run("debounce_status").splitlines()
    assert any(line.startswith("tests.nnn") and "…" in line for line in table)
    assert max(len(line) for line in table) < 200  # the long task name does not pad them all


@pytest.mark.django_db(transaction=True)
def test_keys_of_a_removed_task_are_reported_then_dropped_with_unregistered(eager, store):
    record.trigger("orphan")
    record.trigger("orphan")
    row = DebounceKey.objects.get(key__contains='"orphan"')
    name = record.name
    task = app.tasks.pop(name)  # as if the task was removed or renamed
    try:
        out = run("debounce_purge", "--older-than", "7d")
        assert "1 keys with pending triggers belong to tasks that are not registered" in out
        assert "add --unregistered" in out
        dry = run("debounce_purge", "--older-than", "7d", "--unregistered", "--dry-run")
        assert (
            f"would drop 2 pending triggers on 1 keys of tasks that are not registered "
            f"debounced tasks here: {name}" in dry
        )
        out = run("debounce_purge", "--older-than", "7d", "--unregistered")
        assert "dropped 2 pending triggers on 1 keys" in out
        assert task.get_backend().live_state(row.key_hash)["pending"] == 0
        out = run("debounce_purge", "--older-than", "7d")
        assert "belong to tasks that are not registered" not in out
    finally:
        app.tasks[name] = task
    assert run_due(now=timezone.now() + timedelta(seconds=5)) == 0  # nothing left to run


@pytest.mark.django_db(transaction=True)
def test_purge_closes_runs_whose_finish_was_never_recorded(eager, store):
    record.trigger("unfinished")
    assert run_due(now=timezone.now() + timedelta(seconds=1)) == 1
    finished = DebounceRun.objects.get()
    old = timezone.now() - timedelta(days=8)
    # As a worker leaves it when the store fails at the finish: the run row stays "running"
    # while the key has no live run.
    DebounceRun.objects.filter(pk=finished.pk).update(
        outcome=DebounceRun.Outcome.RUNNING, finished_at=None, started_at=old
    )
    dry = run("debounce_purge", "--older-than", "7d", "--dry-run")
    assert "would close 1 runs still marked running" in dry
    assert DebounceRun.objects.get().outcome == "running"
    out = run("debounce_purge", "--older-than", "7d")
    assert "closed 1 runs still marked running" in out
    assert "deleted 0 idle keys and 1 runs" in out
    assert not DebounceRun.objects.exists()
