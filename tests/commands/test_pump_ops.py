"""What operators see of the due index and the pumps: ``debounce_status --index`` and
``--pumps``, the pump's Prometheus metrics and the index gauges read on scrape.

The index and pump tests use a debounced task registered in this process only: the pump of
the suite's worker (which runs whenever an earlier test started it) never takes its entries,
so what is due and what is published here is this test's alone. Its messages go to a queue
no worker consumes, where the test counts them.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.core.management import call_command
from prometheus_client import REGISTRY

from django_debounce.pump import Pump
from django_debounce.testing import run_due
from tests.celery_app import app
from tests.support.helpers import wait_for
from tests.support.private_tasks import private_task
from tests.testapp.models import RunLog
from tests.testapp.tasks import record, record_slow

LOCAL = "tests.local_pumped"
LOCAL_QUEUE = "debounce-local-pumped"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def index(*args: str) -> dict[str, dict[str, Any]]:
    """``debounce_status --index --json`` by task name."""
    lines = run("debounce_status", "--index", "--json", *args).splitlines()
    return {rec["task"]: rec for rec in map(json.loads, lines)}


@pytest.fixture
def local_task(broker: redis.Redis, settings: Any) -> Iterator[Any]:
    """A debounced task (wait 1 s) known to this process only, whose messages go to a queue of
    its own; with a pump interval shorter than its wait, its flights wait in the due index
    until a pump takes them (none is published at trigger time)."""
    settings.DEBOUNCE_PUMP_INTERVAL = 0.05
    broker.delete(LOCAL_QUEUE)
    try:
        with private_task(LOCAL, wait=1.0, queue=LOCAL_QUEUE) as task:
            yield task
    finally:
        broker.delete(LOCAL_QUEUE)


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


# -- debounce_status --index ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_status_index_shows_depth_due_entries_and_the_oldest_due_age(eager, store, local_task):
    for tag in ("a", "b"):
        local_task.trigger(tag)
        local_task.trigger(tag)  # merged: one entry per key
    for tag in ("x", "y", "z"):
        record_slow.trigger(tag)  # due in 60 s
    first = index()
    assert first[LOCAL] == {"task": LOCAL, "depth": 2, "due": 0, "oldest_due_age_s": 0.0}
    assert first["testapp.record_slow"]["depth"] == 3
    assert first["testapp.record_slow"]["due"] == 0
    assert first["testapp.record_other"]["depth"] == 0  # every registered task is listed

    # Once the wait has passed, both entries are due, and the oldest grows older.
    due = wait_for(
        lambda: (got := index()[LOCAL])["due"] == 2 and got,
        timeout=10,
        message="the local task's entries to be due",
    )
    assert due["depth"] == 2
    assert 0.0 < due["oldest_due_age_s"] < 10.0
    later = wait_for(
        lambda: (got := index()[LOCAL])["oldest_due_age_s"] > due["oldest_due_age_s"] and got,
        timeout=10,
        message="the oldest due entry to age",
    )
    assert later["due"] == 2

    assert list(index("--task", "testapp.record_slow")) == ["testapp.record_slow"]
    table = run("debounce_status", "--index", "--task", LOCAL).splitlines()
    assert table[0].split() == ["task", "depth", "due", "now", "oldest", "due"]
    cells = table[1].split()
    assert cells[:3] == [LOCAL, "2", "2"] and table[1].endswith(" s late")

    # Runs take the entries out of the index; the slow task's stay.
    assert run_due() == 2
    assert sorted(local_task.ran) == [("a", 2), ("b", 2)]
    after = index()
    assert after[LOCAL] == {"task": LOCAL, "depth": 0, "due": 0, "oldest_due_age_s": 0.0}
    assert after["testapp.record_slow"]["depth"] == 3


# -- the pump's metrics and the index gauges -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_pump_metrics_count_published_and_taken_again_and_the_gauges_read_the_index(
    store, local_task, broker, settings
):
    settings.DEBOUNCE_DISPATCH_GRACE = 0.5
    labels = {"task": LOCAL}
    names = (
        "django_debounce_pump_published_total",
        "django_debounce_pump_taken_again_total",
        "django_debounce_pump_tick_seconds_count",
        "django_debounce_pump_tick_seconds_sum",
    )
    before = {name: sample(name) for name in names}
    for tag in ("a", "b", "c"):
        assert not local_task.trigger(tag).scheduled  # waits in the index
    assert broker.llen(LOCAL_QUEUE) == 0
    # The gauges are read from the store when scraped.
    assert sample("django_debounce_index_depth", labels) == 3
    assert sample("django_debounce_index_due", labels) == 0
    assert sample("django_debounce_index_oldest_due_seconds", labels) == 0
    wait_for(
        lambda: sample("django_debounce_index_due", labels) == 3,
        timeout=10,
        message="the gauge of due entries",
    )
    assert sample("django_debounce_index_oldest_due_seconds", labels) > 0

    pump = Pump(app=app, tasks={LOCAL: local_task})
    ticks = 0

    def tick_until(predicate: Any, message: str) -> None:
        def step() -> bool:
            nonlocal ticks
            pump.tick()
            ticks += 1
            return predicate()

        wait_for(step, timeout=15, message=message)

    tick_until(lambda: broker.llen(LOCAL_QUEUE) == 3, "the pump to publish the three flights")
    assert sample(names[0]) - before[names[0]] == 3
    assert sample(names[1]) - before[names[1]] == 0
    # Taken: each entry now waits for its message's claim, until the grace ends.
    assert sample("django_debounce_index_depth", labels) == 3
    assert sample("django_debounce_index_due", labels) == 0

    # Nobody consumes the queue: past DEBOUNCE_DISPATCH_GRACE the pump takes each flight
    # again and publishes its message once more (the same sequence number).
    tick_until(lambda: broker.llen(LOCAL_QUEUE) == 6, "the pump to take the flights again")
    assert sample(names[0]) - before[names[0]] == 6
    assert sample(names[1]) - before[names[1]] == 3
    assert sample(names[2]) - before[names[2]] == ticks
    assert sample(names[3]) > before[names[3]]
    messages = [json.loads(raw) for raw in broker.lrange(LOCAL_QUEUE, 0, -1)]
    sent = [json.loads(base64.b64decode(m["body"]))[1]["__debounce__"] for m in messages]
    by_key: dict[str, list[int]] = {}
    for message in sent:
        by_key.setdefault(message["k"], []).append(message["s"])
    assert len(by_key) == 3
    assert all(len(seqs) == 2 and seqs[0] == seqs[1] for seqs in by_key.values())
    assert local_task.ran == []  # published, never claimed here


# -- debounce_status --pumps -------------------------------------------------------------


def pumps() -> dict[str, dict[str, Any]]:
    """``debounce_status --pumps --json`` by worker name."""
    lines = run("debounce_status", "--pumps", "--json").splitlines()
    return {rec["worker"]: rec for rec in map(json.loads, lines)}


@pytest.mark.worker
def test_status_pumps_asks_the_workers_through_remote_control(worker, unique_tag, settings):
    # The suite's workers run without gossip, mingle and heartbeat: remote control answers.
    name = next(n for n in pumps() if n.startswith(f"{worker.queue}-"))
    first = pumps()[name]
    assert first["pump"] is True and first["ticks"] >= 1
    assert set(first) == {
        "worker",
        "published",
        "taken_again",
        "released",
        "ticks",
        "last_tick_seconds",
        "capped_queues",
        "pump",
    }
    # A flight due later than the pump interval waits in the index: the worker's pump
    # publishes it, and its count grows.
    settings.DEBOUNCE_PUMP_INTERVAL = 0.05
    assert not record.trigger(unique_tag).scheduled
    wait_for(
        lambda: RunLog.objects.filter(task="testapp.record", tag=unique_tag).exists(),
        timeout=30,
        message="the run the worker's pump published",
    )
    now = pumps()[name]
    assert now["published"] >= first["published"] + 1
    assert now["ticks"] > first["ticks"]
    text = run("debounce_status", "--pumps")
    line = next(ln for ln in text.splitlines() if ln.startswith(f"{name}: "))
    assert re.fullmatch(
        rf"{re.escape(name)}: published \d+, taken again \d+, released \d+, \d+ ticks, "
        r"last tick \d+\.\d ms",
        line,
    ), line


# -- system checks ---------------------------------------------------------------------------


def in_a_thread(run: Any) -> None:
    """``run()`` in a thread of its own (database connections are per thread, as the
    worker's threads' are); what it raises is raised here."""
    import threading

    failures: list[BaseException] = []

    def target() -> None:
        try:
            run()
        except BaseException as exc:  # reported to the test
            failures.append(exc)

    t = threading.Thread(target=target)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "the thread did not end within 30 s"
    if failures:
        raise failures[0]


@pytest.mark.django_db(transaction=True)
def test_the_worker_threads_keep_their_database_connection_between_ticks():
    """With ``CONN_MAX_AGE = 0`` (Django's default) ``close_old_connections()`` closes every
    connection; the pump's and the lease keeper's threads call
    ``tidy_thread_connections()`` before each tick instead: the connection of one tick is the
    connection of the next, and Django's age rule is applied once every ``REFRESH`` s."""

    from django.db import connections

    from django_debounce.dbconn import REFRESH, tidy_thread_connections

    alias = "default"
    assert connections[alias].settings_dict["CONN_MAX_AGE"] == 0  # the suite's: Django's default
    seen: list[Any] = []

    def thread() -> None:  # connections are per thread: a thread of its own, as the pump's
        conn = connections[alias]
        for now in (1e9, 1e9 + 1, 1e9 + REFRESH / 2, 1e9 + REFRESH + 1):
            tidy_thread_connections(now=now)
            seen.append(conn.connection)  # the connection this tick starts with
            with conn.cursor() as cursor:
                cursor.execute("SELECT 1")
        conn.close()

    in_a_thread(thread)
    first, second, third, after_refresh = seen
    assert first is None  # the thread's first tick: not connected yet
    assert second is not None and third is second  # kept from tick to tick
    assert after_refresh is None  # REFRESH later: closed by CONN_MAX_AGE = 0


@pytest.mark.django_db(transaction=True)
def test_a_worker_thread_tick_closes_its_sqlite_connection_and_keeps_any_other():
    """``thread_tick()``: on SQLite the tick's connection is closed when it ends (no SQLite
    connection may be open in a thread of a process that forks, tests/unit/test_fork_guard.py);
    on PostgreSQL it is kept for the next tick."""

    from django.db import connections

    from django_debounce.dbconn import thread_tick

    conn = connections["default"]
    after: list[Any] = []

    def thread() -> None:
        mine = connections["default"]
        for _ in range(2):
            with thread_tick(), mine.cursor() as cursor:
                cursor.execute("SELECT 1")
            after.append(mine.connection)
        mine.close()

    in_a_thread(thread)
    if conn.vendor == "sqlite":
        assert after == [None, None]
    else:
        assert after[0] is not None and after[1] is after[0]
