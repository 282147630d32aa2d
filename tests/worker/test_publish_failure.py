"""I8: a trigger never fails because the broker is down. A flight due within the pump
interval is published at once; when the broker refuses that message, the flight is released
back to the due index (not taken), and a pump publishes it once the broker is back. The
broker failure is real: the Celery app of this process is pointed at a loopback port where
nothing listens, then back at the working broker. On both stores, for ``trigger()`` and for a
debounced ``post_save`` receiver, in autocommit and inside ``transaction.atomic()``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from kombu import pools

from django_debounce import trigger_many
from django_debounce.dbconn import closing
from django_debounce.keys import key_hash
from django_debounce.pump import Pump, queue_of, stats
from tests.celery_app import app
from tests.support.helpers import stays, wait_for
from tests.support.servers import free_port
from tests.testapp.models import Item, RunLog
from tests.testapp.tasks import record, record_slow

pytestmark = pytest.mark.worker


def _reset_pools() -> None:
    app.pool.force_close_all()
    app._pool = None
    app.amqp._producer_pool = None
    pools.reset()


@contextmanager
def broker_down() -> Iterator[None]:
    original = app.conf.broker_url
    app.conf.broker_url = f"redis://127.0.0.1:{free_port()}/0"
    _reset_pools()
    try:
        yield
    finally:
        app.conf.broker_url = original
        _reset_pools()


def released(task, key: str) -> bool:
    """The flight of ``key`` waits in the due index, its message not out (released)."""
    from tests.support.peek import peek_store

    hashed = key_hash(task.name, key)
    state = peek_store(task.get_backend(), hashed)
    assert state is not None and state["pending"] >= 1, state
    # not taken; the entry at the due time (or earlier: a merge moves the due time later and
    # leaves the entry, which the pump then moves without publishing)
    return not state["taken"] and state["entry"] is not None and state["entry"] <= state["due"]


def test_a_trigger_whose_message_the_broker_refuses_waits_in_the_index(worker, store, unique_tag):
    key = record.resolve((unique_tag,), {})[0]
    slow_key = record_slow.resolve((unique_tag,), {})[0]
    with broker_down():
        result = record.trigger(unique_tag)  # does not raise (I8)
        # the result says what happened: counted, its message not out
        assert (result.pending, result.scheduled, result.publish_failed) == (1, False, True)
        # the direct publish failed: the flight went back to the index at its due time
        assert released(record, key)
        merged = record.trigger(unique_tag)  # merges, as usual: nothing to publish
        assert (merged.pending, merged.scheduled, merged.publish_failed) == (2, False, False)
        (many,) = trigger_many(record, [(f"{unique_tag}-many",)])  # trigger_many says so too
        assert (many.pending, many.scheduled, many.publish_failed) == (1, False, True)
        last = time.time()
        # a pump whose broker is down: what it took and could not publish goes back to the
        # index (a flight due in 60 s, taken here with the clock moved past it, so that no
        # worker's pump takes it first)
        record_slow.trigger(unique_tag)
        backend = record_slow.get_backend()
        future = timezone.now() + timedelta(seconds=61)
        taken = backend.take({record_slow.name: record_slow.flight_options()}, 10, now=future)
        assert [d.key_hash for d in taken.dispatches] == [key_hash(record_slow.name, slow_key)]
        assert not released(record_slow, slow_key)  # taken
        before = stats.released
        Pump(app=app)._publish(
            backend, queue_of(record_slow), {record_slow.name: record_slow}, taken.dispatches
        )
        assert stats.released == before + 1
        assert released(record_slow, slow_key)
    assert record_slow.cancel(unique_tag) == 1
    # the broker is back: a trigger's publish goes out, and says so
    back = record.trigger(f"{unique_tag}-back")
    assert (back.pending, back.scheduled, back.publish_failed) == (1, True, False)
    # and a pump publishes the refused flight, which runs once
    Pump(app=app).tick()
    runs = wait_for(
        lambda: list(RunLog.objects.filter(tag=unique_tag, finished__isnull=False)),
        message="the run of the flight the broker had refused",
    )
    assert runs[0].task == "testapp.record"
    assert runs[0].triggers == 2 and runs[0].started >= last
    assert stays(lambda: RunLog.objects.filter(tag=unique_tag).count() == 1, duration=1.0)


@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "atomic"])
def test_a_model_save_with_the_broker_down_is_not_lost(worker, store, atomic, unique_tag):
    """``Model.save()`` with debounced ``post_save`` receivers while the broker is down: the
    save succeeds (autocommit, or the commit of ``transaction.atomic()``, where the triggers
    run on commit), and the receivers run after their last trigger (a worker's pump, whose
    broker works, or this process's once its broker is back). Each failed publish takes
    kombu's retries (about half a second), so a worker may run a first flight between the
    two saves: what is checked is that every trigger is covered by a run after it, once."""
    with broker_down():
        if atomic:
            with transaction.atomic():
                item = Item.objects.create(name=unique_tag, value=1)
                item.value = 2
                last = time.time()
                item.save()
        else:
            item = Item.objects.create(name=unique_tag, value=1)
            item.value = 2
            last = time.time()
            item.save()
        assert Item.objects.get(pk=item.pk).value == 2  # the save itself went through
    Pump(app=app).tick()
    for receiver in ("testapp.item_saved", "testapp.item_audit"):
        wait_for(
            lambda receiver=receiver: RunLog.objects.filter(
                task=receiver, finished__isnull=False, payload__pk=item.pk, started__gte=last
            ).exists(),
            message=f"a run of {receiver} after the last save",
        )
    for receiver in ("testapp.item_saved", "testapp.item_audit"):
        assert stays(
            lambda receiver=receiver: (
                sum(
                    RunLog.objects.filter(task=receiver, payload__pk=item.pk).values_list(
                        "triggers", flat=True
                    )
                )
                == 2
            ),
            duration=1.0,
        ), f"{receiver}: each of the two triggers in exactly one run: " + repr(
            list(
                RunLog.objects.filter(task=receiver, payload__pk=item.pk).values_list(
                    "triggers", "flight_id", "run_id", "started", "pid"
                )
            )
        )
        flights = list(
            RunLog.objects.filter(task=receiver, payload__pk=item.pk).values_list(
                "flight_id", flat=True
            )
        )
        assert len(flights) == len(set(flights))  # no flight ran twice (I5)
    seen = RunLog.objects.filter(task="testapp.item_saved", payload__pk=item.pk, started__gte=last)
    assert seen.order_by("-started").first().value_seen == 2  # the last run saw the save


def test_a_batch_the_broker_refuses_ends_the_pumps_tick(
    celery_worker_session, store, transactional_db, unique_tag, settings
):
    """More flights due than one batch, and a broker that refuses: the pump's tick takes one
    batch, releases it whole and returns (before, it took and released the same batch again
    and again within the tick). Once the broker is back, the next tick publishes every flight
    and each runs once."""
    celery_worker_session.stop()  # no other pump takes these flights meanwhile
    try:
        settings.DEBOUNCE_PUMP_BATCH = 2
        tags = [f"{unique_tag}-{i}" for i in range(3)]
        pump = Pump(app=app, tasks={record.name: record})
        with broker_down():
            for tag in tags:  # due at once: each publish is refused, each flight released
                assert record.trigger(tag, debounce_wait=0).publish_failed
            before = (stats.released, stats.published)
            ticks: list[float] = []
            tick = closing(lambda: ticks.append(pump.tick()))
            thread = threading.Thread(target=tick, daemon=True)
            thread.start()
            thread.join(timeout=60)
            assert ticks, "the tick did not return"
            assert (stats.released - before[0], stats.published - before[1]) == (2, 0)
            assert all(released(record, record.resolve((tag,), {})[0]) for tag in tags)
        pump.tick()
        assert stats.published - before[1] == 3
    finally:
        celery_worker_session.start()
    for tag in tags:
        wait_for(
            lambda tag=tag: RunLog.objects.filter(tag=tag, finished__isnull=False).exists(),
            message=f"the run of {tag}",
        )
    assert stays(lambda: RunLog.objects.filter(tag__in=tags).count() == 3, duration=1.0)
