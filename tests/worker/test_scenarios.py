"""The foundation scenarios, against a real worker, on the database under test."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from django_debounce import trigger_many
from django_debounce.dispatch import DISPATCH_KWARG
from django_debounce.keys import key_hash
from django_debounce.models import DebounceKey, DebounceRun
from tests.support.helpers import stays, wait_for
from tests.support.procs import trigger_from_processes
from tests.testapp.models import Doc, Item, OtherItem, RunLog
from tests.testapp.tasks import coalesce, doc_saved, item_saved, record, record_slow

pytestmark = pytest.mark.worker


def finished(**filters):
    return list(RunLog.objects.filter(finished__isnull=False, **filters).order_by("started"))


def key_row(task, *args) -> DebounceKey:
    k, _payload = task.resolve(args, {})
    return DebounceKey.objects.get(key_hash=key_hash(task.name, k))


def test_duplicate_delivery_of_one_dispatch_message_runs_once(worker, unique_tag):
    result = record.trigger(unique_tag)
    assert result.scheduled and result.pending == 1
    row = key_row(record, unique_tag)
    live = record.get_backend().live_state(row.key_hash)
    message = {DISPATCH_KWARG: {"k": row.key_hash, "s": live["seq"], "v": 2}}
    record.apply_async(kwargs=message, countdown=0)  # the same message again, at once
    record.apply_async(kwargs=message, countdown=1)  # and 1 s later
    wait_for(lambda: finished(tag=unique_tag), message="the run")
    # The copy 1 s later has been handled once the broker holds nothing and the worker is idle.
    assert stays(lambda: len(finished(tag=unique_tag)) == 1, duration=2.0)
    live = record.get_backend().live_state(row.key_hash)
    assert live["pending"] == 0
    assert live["runs"] == 1
    # the run's row is written in the claim's and the finish's own transactions
    runs = DebounceRun.objects.filter(debounce_key=row)
    wait_for(runs.exists, message="the run's record")
    assert runs.count() == 1


def test_trigger_inside_atomic_runs_after_commit_and_reads_committed_row(worker):
    doc = Doc.objects.create(value=1)
    wait_for(lambda: RunLog.objects.filter(task="testapp.doc_saved", value_seen=1).exists())
    RunLog.objects.all().delete()
    # The first run's finish is in its key's row before the transaction below holds the
    # database.
    row = wait_for(
        lambda: DebounceKey.objects.filter(task_name="testapp.doc_saved", state="idle").first(),
        message="the first run recorded",
    )
    with transaction.atomic():
        doc.value = 2
        doc.save()
        # The receiver's wait is 0 and the worker is idle: nothing may run before commit.
        assert stays(lambda: not RunLog.objects.exists(), duration=1.0)
        assert DebounceKey.objects.filter(task_name="testapp.doc_saved", pending__gt=0).count() == 0
        assert doc_saved.get_backend().live_state(row.key_hash)["pending"] == 0  # nor in the store
    runs = wait_for(lambda: list(RunLog.objects.filter(task="testapp.doc_saved")))
    assert stays(lambda: RunLog.objects.count() == 1, duration=1.0)
    assert runs[0].value_seen == 2


def test_row_created_in_transaction_is_seen_by_its_run(worker):
    with transaction.atomic():
        doc = Doc.objects.create(value=7)
        assert stays(lambda: not RunLog.objects.exists(), duration=0.5)
    runs = wait_for(lambda: list(RunLog.objects.filter(task="testapp.doc_saved")))
    assert stays(lambda: RunLog.objects.count() == 1, duration=1.0)
    assert runs[0].value_seen == 7
    assert runs[0].payload == {"pk": doc.pk, "created": True}


def test_rollback_leaves_no_trace(worker, broker, unique_tag):
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        for _ in range(3):
            assert record.trigger(unique_tag).deferred
        raise Boom
    assert DebounceKey.objects.count() == 0
    assert broker.llen("debounce-tests") == 0
    assert stays(lambda: not RunLog.objects.exists(), duration=1.0)
    record.trigger(unique_tag)
    wait_for(lambda: finished(tag=unique_tag))
    assert stays(lambda: len(finished(tag=unique_tag)) == 1, duration=1.0)
    row = key_row(record, unique_tag)
    assert (row.triggers, row.runs, row.pending) == (1, 1, 0)


def test_same_pk_of_two_models_and_two_tasks_are_separate_keys(worker):
    Item.objects.create(pk=1, name="a")
    OtherItem.objects.create(pk=1)
    for task in ("testapp.item_saved", "testapp.item_audit", "testapp.other_saved"):
        wait_for(lambda task=task: RunLog.objects.filter(task=task).exists(), message=task)
    assert stays(
        lambda: (
            RunLog.objects.filter(
                task__in=["testapp.item_saved", "testapp.item_audit", "testapp.other_saved"]
            ).count()
            == 3
        ),
        duration=1.0,
    )
    assert {log.key for log in RunLog.objects.filter(task="testapp.item_saved")} == {
        "testapp.item:1"
    }
    assert {log.key for log in RunLog.objects.filter(task="testapp.other_saved")} == {
        "testapp.otheritem:1"
    }


def test_ten_triggers_over_three_seconds_with_wait_five_run_once_after_quiet_period(worker):
    item = Item.objects.create(name="slow", value=0)
    last = 0.0
    for value in range(1, 11):
        item.value = value
        item.save()
        last = time.time()
        time.sleep(0.33)
    runs = wait_for(lambda: list(RunLog.objects.filter(task="testapp.item_slow")), timeout=30)
    assert stays(lambda: RunLog.objects.filter(task="testapp.item_slow").count() == 1, duration=1.0)
    assert runs[0].value_seen == 10
    assert runs[0].started >= last + 5.0
    assert runs[0].triggers == 11  # the create and ten updates


def test_first_trigger_of_a_key_from_four_processes(worker, unique_tag):
    errors = trigger_from_processes("record_slow", [[[unique_tag]]] * 4)
    assert errors == []
    rows = DebounceKey.objects.filter(task_name="testapp.record_slow")
    assert rows.count() == 1
    live = record_slow.get_backend().live_state(rows[0].key_hash)
    assert (live["pending"], live["triggers"], live["flight_id"]) == (4, 4, 1)
    record_slow.cancel(unique_tag)


def test_trigger_during_a_run_gets_exactly_one_follow_up(worker, unique_tag):
    record.trigger(unique_tag, 3.0)
    first = wait_for(lambda: RunLog.objects.filter(tag=unique_tag).first(), message="first run")
    record.trigger(unique_tag, 3.0)
    runs = wait_for(lambda: (r := finished(tag=unique_tag)) and len(r) == 2 and r, timeout=30)
    assert stays(lambda: RunLog.objects.filter(tag=unique_tag).count() == 2, duration=1.0)
    assert runs[0].pk == first.pk
    assert runs[1].started >= runs[0].finished
    assert runs[1].triggers == 1


def test_bulk_create_sends_nothing_and_trigger_many_runs_once_per_key(worker):
    items = Item.objects.bulk_create([Item(name=f"bulk{i}", value=i) for i in range(5)])
    assert stays(lambda: not DebounceKey.objects.exists(), duration=0.6)
    results = trigger_many(item_saved, items + items)
    assert len(results) == 10
    assert len({r.key for r in results}) == 5
    wait_for(lambda: RunLog.objects.filter(task="testapp.item_saved").count() == 5)
    assert stays(
        lambda: RunLog.objects.filter(task="testapp.item_saved").count() == 5, duration=1.0
    )
    assert sorted(r.value_seen for r in RunLog.objects.filter(task="testapp.item_saved")) == list(
        range(5)
    )
    assert all(r.triggers == 2 for r in RunLog.objects.filter(task="testapp.item_saved"))


def test_coalesce_never_overlaps_and_covers_last_trigger(worker, unique_tag):
    coalesce.trigger(unique_tag, 0.3)
    # the first run has started (it writes its log row first): the triggers below come while
    # it runs or after it, never into it
    wait_for(lambda: RunLog.objects.filter(tag=unique_tag).exists(), message="first run")
    for _ in range(38):
        coalesce.trigger(unique_tag, 0.3)
    last = time.time()
    coalesce.trigger(unique_tag, 0.3)
    wait_for(lambda: sum(r.triggers for r in finished(tag=unique_tag)) == 40, timeout=30)
    runs = finished(tag=unique_tag)
    assert stays(lambda: RunLog.objects.filter(tag=unique_tag).count() == len(runs), duration=1.0)
    # coalescing does not wait for a quiet period: what came during the first run runs after
    # it, and runs never overlap
    assert runs[0].triggers == 1
    assert len(runs) >= 2
    for a, b in zip(runs, runs[1:], strict=False):
        assert b.started >= a.finished
    assert runs[-1].started >= last  # the last run covers the last trigger


def test_doc_receiver_skips_deleted_rows(worker):
    doc = Doc.objects.create(value=1)
    wait_for(lambda: RunLog.objects.filter(task="testapp.doc_saved").exists())
    RunLog.objects.all().delete()
    with transaction.atomic():
        doc.value = 5
        doc.save()
        doc.delete()
    wait_for(lambda: DebounceRun.objects.filter(task_name="testapp.doc_saved").count() == 2)
    assert not RunLog.objects.exists()
    assert doc_saved.name == "testapp.doc_saved"
