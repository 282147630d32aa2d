"""A project with two databases, run as a user runs it: ``manage.py`` in a subprocess, with
tests/settings_two_databases.py. The commands (issue 13.7) read the tables where the router
puts them, ``--database`` names another alias, a database without the tables is a clear
error, and the output says which database it read; a trigger inside a transaction on the
other database waits for its commit (issue 12.5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository


def manage(tmp_path: Path, *args: str, route: str = "") -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings_two_databases",
        "DEBOUNCE_TEST_DEFAULT_PATH": str(tmp_path / "default.sqlite3"),
        "DEBOUNCE_TEST_OTHER_PATH": str(tmp_path / "other.sqlite3"),
        "DEBOUNCE_TEST_ROUTE": route,
    }
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def migrated(tmp_path: Path) -> Path:
    """``default`` migrated, ``other`` empty (no debounce tables)."""
    done = manage(tmp_path, "migrate", "--noinput")
    assert done.returncode == 0, done.stderr
    return tmp_path


def test_a_database_without_the_tables_is_a_clear_error(migrated: Path) -> None:
    for command in (
        ["debounce_purge", "--older-than", "1d", "--database", "other"],
        ["debounce_status", "--database", "other"],
    ):
        done = manage(migrated, *command)
        assert done.returncode == 1, done
        assert "Traceback" not in done.stderr, done.stderr
        assert "debounce tables in database 'other'" in done.stderr
        assert "manage.py migrate django_debounce --database other" in done.stderr


def test_an_unknown_alias_names_the_known_ones(migrated: Path) -> None:
    done = manage(migrated, "debounce_status", "--database", "nope")
    assert done.returncode == 1 and "default, other" in done.stderr, done.stderr


def test_the_commands_use_and_name_the_routers_database(tmp_path: Path) -> None:
    for alias in ("default", "other"):
        done = manage(
            tmp_path, "migrate", "--noinput", "--database", alias, route="DebounceOnOther"
        )
        assert done.returncode == 0, done.stderr
    purge = manage(tmp_path, "debounce_purge", "--older-than", "1d", route="DebounceOnOther")
    assert purge.returncode == 0, purge.stderr
    assert purge.stdout.rstrip().endswith("[database other]"), purge.stdout
    status = manage(tmp_path, "debounce_status", route="DebounceOnOther")
    assert status.returncode == 0 and "no pending or running keys" in status.stdout, status
    # the tables are not in default: --database default says so
    default = manage(tmp_path, "debounce_status", "--database", "default", route="DebounceOnOther")
    assert default.returncode == 1 and "database 'default'" in default.stderr, default.stderr


def test_status_refuses_an_unknown_task_as_purge_does(migrated: Path) -> None:
    for command in (["debounce_status"], ["debounce_purge", "--older-than", "1d"]):
        done = manage(migrated, *command, "--task", "testapp.recrod")
        assert done.returncode == 1, done
        assert "'testapp.recrod' is neither a registered debounced task" in done.stderr
        assert "Did you mean 'testapp.record'" in done.stderr


TRANSACTION_ON_OTHER = """
from django.db import transaction
from django_debounce import trigger_many
from tests.testapp.models import Item
from tests.testapp.tasks import item_saved, record

with transaction.atomic(using="other"):
    item = Item.objects.create(name="x")
    print("receiver", item_saved.trigger(item).deferred)
    print("many", trigger_many(item_saved, [item])[0].deferred)
    print("plain", record.trigger("plain").deferred)
    print("inside", item_saved.status(item))
print("after", item_saved.status(item).pending, record.status("plain").pending)
"""


def test_a_trigger_inside_a_transaction_on_another_database_waits_for_its_commit(tmp_path):
    """Issue 12.5: a router sends the test app's models to ``other``; triggers made inside
    ``atomic(using="other")`` count at its commit: the receiver's (its row lives there) and
    a plain task's (the only database with a transaction open)."""
    for alias in ("default", "other"):
        done = manage(tmp_path, "migrate", "--noinput", "--database", alias, route="ItemsOnOther")
        assert done.returncode == 0, done.stderr
    done = manage(tmp_path, "shell", "-c", TRANSACTION_ON_OTHER, route="ItemsOnOther")
    assert done.returncode == 0, done.stderr
    words = ("receiver", "many", "plain", "inside", "after")
    lines = [line for line in done.stdout.splitlines() if line.startswith(words)]
    assert lines[:4] == ["receiver True", "many True", "plain True", "inside None"], lines
    # the post_save receiver, trigger() and trigger_many(): three triggers of one key
    assert lines[4] == "after 3 1", lines
