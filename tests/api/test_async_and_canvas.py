"""Async code (issue 13.2), per-trigger options and ``status()`` (13.5), and the way in for
beat, ``send_task`` and canvas (13.3)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from celery import chain, group
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connections

from django_debounce import canvas, dbtime
from django_debounce.exceptions import UnknownTask
from django_debounce.testing import run_due
from tests.celery_app import app
from tests.support.helpers import wait_for
from tests.testapp.models import Item, RunLog
from tests.testapp.tasks import item_saved, record, record_slow

pytestmark = pytest.mark.django_db(transaction=True)


# -- async ----------------------------------------------------------------------------------


def run(coro):
    """``asyncio.run(coro)``, then close the database connection of the thread that
    ``sync_to_async`` used (a request's end would), so the test database can be dropped."""

    async def main():
        try:
            return await coro
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


def test_atrigger_and_astatus_from_async_code(eager, store):
    async def view():
        first = await record_slow.atrigger("async")
        second = await record_slow.atrigger("async")
        return first, second, await record_slow.astatus("async")

    first, second, status = run(view())
    assert (first.pending, second.pending) == (1, 2) and first.flight_id == second.flight_id
    assert status.pending == 2 and status.state == "pending"


def test_a_sync_trigger_in_a_running_event_loop_names_atrigger(eager, store, monkeypatch):
    async def view():
        record_slow.trigger("loop")

    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)
    with pytest.raises(SynchronousOnlyOperation, match=r"await task\.atrigger"):
        run(view())
    with pytest.raises(SynchronousOnlyOperation, match=r"await task\.astatus"):
        run(_status_in_loop())
    assert record_slow.status("loop") is None  # refused before anything was stored
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # as Django lets one opt out
    run(view())
    assert record_slow.status("loop").pending == 1


async def _status_in_loop():
    record_slow.status("loop")


def test_asave_and_acreate_trigger_receivers(eager, store):
    async def view():
        item = await Item.objects.acreate(name="a")
        item.value = 2
        await item.asave()
        return item

    item = run(view())
    assert item_saved.status(item).pending == 2
    assert run_due(now=dbtime.now() + timedelta(seconds=1)) == 2  # item_saved, item_audit
    (ran,) = RunLog.objects.filter(task="testapp.item_saved")
    assert ran.triggers == 2


# -- per-trigger options and status ---------------------------------------------------------


def test_per_trigger_wait_and_max_wait(eager, store):
    before = dbtime.now()
    long = record.trigger("long", debounce_wait=20)  # the task's wait is 0.3 s
    assert 19 < (long.due_at - before).total_seconds() < 21
    # a flight is due wait after its last trigger, bounded by the smallest anchor + max_wait
    # among its triggers: the first trigger's bound holds the later trigger's long wait
    first = record.trigger("bounded", debounce_wait=5, debounce_max_wait=6)
    assert 4 < (first.due_at - before).total_seconds() < 6
    again = record.trigger("bounded", debounce_wait=30)
    assert 5 < (again.due_at - before).total_seconds() < 7
    # the options are not arguments of the body: the same key as a plain trigger
    assert long.key == record.resolve(("long",), {})[0]


def test_a_shorter_per_call_wait_brings_the_run_earlier(eager, store):
    """As lodash restarts its timer at each call: a flight is due its last trigger's time
    plus that trigger's wait, so ``debounce_wait=0`` on a pending key runs it now, and a
    smaller ``debounce_max_wait`` bounds it sooner."""
    before = dbtime.now()
    waiting = record.trigger("rush", debounce_wait=20)
    assert (waiting.due_at - before).total_seconds() > 19
    now = record.trigger("rush", debounce_wait=0)  # a user is waiting: now
    assert now.due_at is not None and (now.due_at - before).total_seconds() < 2
    assert run_due(now=dbtime.now() + timedelta(seconds=0.5)) == 1
    (ran,) = RunLog.objects.filter(task="testapp.record", tag="rush")
    assert ran.triggers == 2
    record.trigger("bound", debounce_wait=20)
    bounded = record.trigger("bound", debounce_max_wait=3)
    assert (bounded.due_at - before).total_seconds() < 5


def test_status_reports_the_flight_and_the_last_run(eager, store):
    assert record.status("never") is None
    record.trigger("s")
    record.trigger("s")
    pending = record.status("s")
    assert (pending.state, pending.pending, pending.running, pending.runs) == (
        "pending",
        2,
        False,
        0,
    )
    assert pending.due_at is not None and pending.last_run_at is None
    assert run_due(now=dbtime.now() + timedelta(seconds=1)) == 1
    done = record.status("s")
    assert (done.state, done.pending, done.due_at, done.last_outcome) == (
        "idle",
        0,
        None,
        "success",
    )
    assert (done.triggers, done.runs, done.merged) == (2, 1, 1)
    assert done.last_run_at is not None and done.key == pending.key


# -- beat, send_task and canvas -------------------------------------------------------------


def test_the_trigger_task_refuses_names_that_are_not_debounced_tasks(eager):
    for name in ("testapp.nope", "django_debounce.trigger", "celery.backend_cleanup"):
        result = canvas.trigger.apply(args=(name, []))
        assert result.failed() and isinstance(result.result, UnknownTask), name
    bad = canvas.trigger.apply(args=("testapp.record", "not a list"))
    assert bad.failed() and isinstance(bad.result, TypeError)


def test_trigger_s_is_an_immutable_signature_of_the_trigger_task():
    sig = record.trigger_s("t", note="n")
    assert sig.task == "django_debounce.trigger" and sig.immutable
    assert tuple(sig.args) == ("testapp.record", ["t"], {"note": "n"})


@pytest.mark.worker
def test_send_task_chain_and_group_debounce_through_the_trigger_task(worker, unique_tag):
    """Five triggers by name (send_task twice, a chain of two, a group of one) in a burst:
    one run of the debounced task, with all five triggers."""
    app.send_task("django_debounce.trigger", args=("testapp.record", [unique_tag]))
    app.send_task("django_debounce.trigger", args=("testapp.record", [unique_tag]))
    chain(record.trigger_s(unique_tag), record.trigger_s(unique_tag)).delay()
    group([record.trigger_s(unique_tag)]).delay()
    ran = wait_for(
        lambda: [
            r
            for r in RunLog.objects.filter(task="testapp.record", tag=unique_tag)
            if r.finished and sum(x.triggers for x in RunLog.objects.filter(tag=unique_tag)) == 5
        ],
        timeout=30,
        message="the triggers' runs",
    )
    assert sum(r.triggers for r in ran) == 5
    assert len(ran) <= 2  # a burst merges (two when a run started between the sends)
