"""debounce_purge and debounce_status in more detail: bad arguments (also from a shell, as an
operator types them), batches, --task, recovery counts, live values from Redis."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_debounce.backends import get_backend
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.testing import run_due
from tests.support.helpers import ROOT, wait_for
from tests.support.private_tasks import private_task
from tests.testapp.tasks import record, record_other, record_slow


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def shell(*args: str) -> subprocess.CompletedProcess[str]:
    """``django-admin ARGS`` in a new process, as an operator runs it."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args, exit_code, message",
    [
        (["--older-than", "3y"], 1, "use a number with a unit s, m, h, d or w (e.g. 45s"),
        (["--older-than", "soon", "--dry-run"], 1, "HH:MM:SS"),
        (["--older-than", "7d", "--batch-size", "0"], 1, "--batch-size must be an integer from 1"),
        (["--older-than", "7d", "--batch-size", "many"], 2, "invalid int value: 'many'"),
        (["--older-than", "7d", "--database", "nosuch"], 1, "use one of: default"),
        ([], 2, "the following arguments are required: --older-than"),
    ],
)
def test_bad_arguments_from_the_shell(args, exit_code, message):
    proc = shell("debounce_purge", *args)
    assert proc.returncode == exit_code, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_task_names_the_accepted_form_and_the_known_tasks(db):
    with pytest.raises(CommandError) as err:
        run("debounce_purge", "--older-than", "7d", "--task", "testapp.recrod")
    text = str(err.value)
    assert "Give the task's Celery name" in text
    assert "Did you mean 'testapp.record'" in text  # registered debounced tasks are offered


@pytest.mark.parametrize("limit", ["0", "-5", "1e20", "99999999999999999999", "100.0", "1000001"])
def test_status_bad_limit(db, limit):
    """A limit that is no count (or one past what a listing can show: ``1e20`` in digits
    overflowed the database's LIMIT and was reported as missing tables) names the accepted
    values."""
    with pytest.raises(CommandError, match=r"--limit must be a positive integer up to 1,000,000"):
        run("debounce_status", "--limit", limit)


def test_status_bad_limit_from_the_shell():
    proc = shell("debounce_status", "--limit", "1e20")
    assert proc.returncode == 2, proc.stderr
    assert "argument --limit: --limit must be a positive integer up to 1,000,000" in proc.stderr
    assert "got '1e20'" in proc.stderr
    assert "debounce tables" not in proc.stderr and "Traceback" not in proc.stderr


def _age(key_ids, days=10):
    old = timezone.now() - timedelta(days=days)
    DebounceKey.objects.filter(pk__in=key_ids).update(updated_at=old)
    DebounceRun.objects.filter(debounce_key_id__in=key_ids).update(started_at=old)


@pytest.mark.django_db(transaction=True)
def test_purge_deletes_in_batches_and_task_limits_the_deletion(eager, store):
    for i in range(9):
        record.trigger(f"batch-{i}")
    record_other.trigger("other")
    assert run_due(now=timezone.now() + timedelta(seconds=1)) == 10
    _age(DebounceKey.objects.values_list("pk", flat=True))
    out = run("debounce_purge", "--older-than", "7d", "--task", "testapp.record", "--dry-run")
    assert "would delete 9 idle keys and 9 runs" in out
    with CaptureQueriesContext(connection) as ctx:
        out = run(
            "debounce_purge", "--older-than", "7d", "--task", "testapp.record", "--batch-size", "4"
        )
    assert "deleted 9 idle keys and 9 runs" in out
    deletes = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("DELETE")]
    run_deletes = [q for q in deletes if "debouncerun" in q and "debouncekey" not in q.split()[2]]
    assert len(run_deletes) >= 3  # 9 runs in batches of 4, then the keys' (empty) cascades
    assert list(DebounceKey.objects.values_list("task_name", flat=True)) == ["testapp.record_other"]


@pytest.mark.django_db(transaction=True)
def test_purge_reports_lost_leases_in_a_dry_run_and_redoes_them(eager, store):
    # A task no worker knows: the pump of a worker would redo the lost run before the purge.
    with private_task("tests.purge_lease", wait=0.3) as task:
        task.trigger("lease")
        row = DebounceKey.objects.get()
        soon = timezone.now() + timedelta(seconds=0.5)
        options = dataclasses.replace(task.flight_options(), lease=0.01)
        decision = get_backend().fire(
            row.key_hash, None, task_name=task.name, options=options, now=soon
        )
        assert decision.claim is not None  # claimed; its worker "dies"
        # The lease (0.01 s) ends half a second from now, on the store's clock.
        out = wait_for(
            lambda: (
                (dry := run("debounce_purge", "--older-than", "7d", "--dry-run"))
                and "would redo 1 runs whose lease ran out" in dry
                and dry
            ),
            timeout=10,
            message="the lease to run out",
        )
        assert "(dry run: nothing recovered or deleted)" in out
        assert get_backend().live_state(row.key_hash)["state"] == "running"
        out = run("debounce_purge", "--older-than", "7d")
        assert "redid 1 runs whose lease ran out" in out
        assert get_backend().live_state(row.key_hash)["state"] == "pending"


@pytest.mark.django_db(transaction=True)
def test_status_reads_live_values_from_redis(eager):
    with override_settings(DEBOUNCE_BACKEND="redis"):
        for _ in range(6):
            record_slow.trigger("status")
        # the row is written when the flight opens and at its second trigger (which makes
        # the counter); the counter absorbs the four others
        assert DebounceKey.objects.get().pending == 2
        (line,) = run("debounce_status", "--json").splitlines()
        table = run("debounce_status")
    rec = json.loads(line)
    # pending is live (the counter's four added); the total is the row's until a fold
    assert (rec["pending"], rec["triggers"], rec["state"]) == (6, 2, "pending")
    assert rec["fires"].startswith("in ") and 0 < rec["due_in_s"] <= record_slow.wait
    header, row = table.splitlines()
    assert header.split() == [
        "task",
        "key",
        "state",
        "pending",
        "fires",
        "triggers",
        "runs",
        "merged",
    ]
    assert "testapp.record_slow" in row and " 6 " in row
