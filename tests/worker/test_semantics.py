"""Issue 4 semantics against a real worker, on every store: edges (lodash), throttle, collect,
retries, leases from time limits, a lost dispatch message taken again by the pump, and an ETA
message the broker delivers twice."""

from __future__ import annotations

import re
import time

import pytest

from django_debounce.keys import key_hash
from django_debounce.models import DebounceKey, DebounceRun
from tests.support.helpers import stays, wait_for
from tests.support.workers import Worker
from tests.testapp.models import Batchy, RunLog
from tests.testapp.tasks import (
    asks_retry,
    batch,
    eta,
    flaky,
    lead,
    lead_only,
    limited,
    orphan,
    throttled,
)

pytestmark = pytest.mark.worker


def runs(task: str, tag: str | None = None, *, done: bool = True) -> list[RunLog]:
    qs = RunLog.objects.filter(task=task)
    if tag is not None:
        qs = qs.filter(tag=tag)
    if done:
        qs = qs.filter(finished__isnull=False)
    return list(qs.order_by("started"))


def key_row(task, *args) -> DebounceKey:
    k, _payload = task.resolve(args, {})
    return DebounceKey.objects.get(key_hash=key_hash(task.name, k))


def outcomes(row: DebounceKey) -> list[str]:
    return list(
        DebounceRun.objects.filter(debounce_key=row)
        .order_by("run_id", "id")
        .values_list("outcome", flat=True)
    )


# -- edges --------------------------------------------------------------------------------


def test_leading_runs_at_once_and_trailing_only_if_more_came(worker, unique_tag):
    first = time.time()
    assert lead.trigger(unique_tag).scheduled
    leading = wait_for(lambda: runs("testapp.lead", unique_tag), message="the leading run")
    assert leading[0].started < first + lead.wait  # not after the quiet period: the leading edge
    last = 0.0
    for _ in range(4):
        lead.trigger(unique_tag)
        last = time.time()
    trailing = wait_for(
        lambda: runs("testapp.lead", unique_tag)[1:], timeout=20, message="the trailing run"
    )
    assert trailing[0].started >= last + lead.wait - 0.05
    assert [r.triggers for r in runs("testapp.lead", unique_tag)] == [1, 4]
    assert stays(lambda: len(runs("testapp.lead", unique_tag, done=False)) == 2, duration=1.5)


def test_leading_alone_makes_no_trailing_run(worker, unique_tag):
    lead.trigger(unique_tag)
    wait_for(lambda: runs("testapp.lead", unique_tag), message="the leading run")
    assert stays(lambda: len(runs("testapp.lead", unique_tag, done=False)) == 1, duration=2.0)


def test_trailing_false_drops_triggers_inside_the_window(worker, unique_tag):
    lead_only.trigger(unique_tag)
    wait_for(lambda: runs("testapp.lead_only", unique_tag), message="the leading run")
    dropped = [lead_only.trigger(unique_tag) for _ in range(3)]
    assert all(r.pending == 0 and not r.scheduled and r.dropped for r in dropped)
    assert stays(lambda: len(runs("testapp.lead_only", unique_tag, done=False)) == 1, duration=1.5)
    row = key_row(lead_only, unique_tag)
    live = lead_only.get_backend().live_state(row.key_hash)
    assert (live["triggers"], live["runs"], live["cancelled"], live["pending"]) == (4, 1, 3, 0)
    # quiet for `wait`: the next trigger is a leading edge again
    time.sleep(lead_only.wait + 0.1)
    lead_only.trigger(unique_tag)
    wait_for(lambda: len(runs("testapp.lead_only", unique_tag)) == 2, message="a new leading run")


def test_throttle_runs_at_most_once_per_wait_during_a_stream(worker, unique_tag):
    end = time.time() + 3.0
    last = 0.0
    while time.time() < end:
        throttled.trigger(unique_tag)
        last = time.time()
        time.sleep(0.02)
    wait_for(
        lambda: (r := runs("testapp.throttled", unique_tag)) and r[-1].started >= last,
        timeout=20,
        message="a run after the last trigger",
    )
    done = runs("testapp.throttled", unique_tag)
    starts = [r.started for r in done]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= throttled.wait - 0.05, gaps
    assert 4 <= len(done) <= 9, len(done)  # ~3 s / 0.5 s, plus the leading and trailing edges
    assert done[0].started < starts[0] + 0.5 and done[0].triggers <= 3  # the leading edge
    row = key_row(throttled, unique_tag)
    live = throttled.get_backend().live_state(row.key_hash)
    assert (live["pending"], live["state"]) == (0, "idle")
    assert sum(r.triggers for r in done) == live["triggers"]  # every trigger ran, once (I6)
    # The row's count: the counters the claims sealed were folded into it.
    wait_for(
        lambda: key_row(throttled, unique_tag).triggers == live["triggers"],
        timeout=20,
        message="the durable record's trigger count",
    )


# -- collect ------------------------------------------------------------------------------


def test_collect_passes_distinct_items_in_trigger_order(worker, unique_tag):
    for n in (3, 1, 3, 2, 1):
        batch.trigger({"tag": unique_tag, "n": n})
    done = wait_for(lambda: runs("testapp.batch", unique_tag), message="the batch run")
    assert done[0].payload == [3, 1, 2]
    assert done[0].triggers == 5
    assert stays(lambda: len(runs("testapp.batch", unique_tag, done=False)) == 1, duration=1.0)


def test_collect_limit_caps_every_run_and_loses_nothing(worker, unique_tag):
    for n in range(1, 13):
        batch.trigger({"tag": unique_tag, "n": n})
    wait_for(
        lambda: sum(len(r.payload) for r in runs("testapp.batch", unique_tag)) == 12,
        message="every item in a run",
    )
    done = runs("testapp.batch", unique_tag)
    assert all(len(r.payload) <= 5 for r in done)
    assert [n for r in done for n in r.payload] == list(range(1, 13))
    assert sum(r.triggers for r in done) == 12
    # the first run started at once, when the flight filled up, not after the quiet period
    assert done[0].payload == [1, 2, 3, 4, 5]


def test_collect_refuses_a_non_json_item_and_stores_nothing(worker, unique_tag):
    with pytest.raises(TypeError, match="object"):
        batch.trigger({"tag": unique_tag, "n": object()})
    assert not DebounceKey.objects.exists()


def test_collecting_receiver_gets_pks_and_the_rows_still_there(worker):
    rows = [Batchy.objects.create(value=i) for i in range(3)]
    rows[0].value = 10
    rows[0].save()
    pks = [r.pk for r in rows]
    rows[2].delete()  # gone before the run: left out of `instances`
    done = wait_for(lambda: runs("testapp.batchy_saved", done=False), message="the run")
    assert stays(lambda: len(runs("testapp.batchy_saved", done=False)) == 1, duration=1.0)
    assert done[0].payload["pks"] == pks  # distinct, in trigger order
    assert done[0].payload["seen"] == [[rows[0].pk, 10], [rows[1].pk, 1]]
    assert done[0].triggers == 4
    assert done[0].key == "testapp.batchy"


# -- failures and retries -----------------------------------------------------------------


def test_failed_run_is_retried_and_a_trigger_during_the_backoff_joins_it(worker, unique_tag):
    flaky.trigger(unique_tag, 1)
    first = wait_for(lambda: runs("testapp.flaky", unique_tag), message="the first attempt")
    row = key_row(flaky, unique_tag)
    wait_for(lambda: outcomes(row) == ["retry"], message="the failure recorded as retried")
    flaky.trigger(unique_tag, 1)  # during the 1 s backoff
    done = wait_for(lambda: (r := runs("testapp.flaky", unique_tag))[1:] and r, message="the retry")
    assert done[1].started >= first[0].finished + flaky.default_retry_delay - 0.05
    assert done[1].payload == {"attempt": 1}
    assert done[1].triggers == 2  # the failed run's trigger and the one from the backoff
    wait_for(lambda: outcomes(row) == ["retry", "success"], message="the retry's success")
    assert stays(lambda: len(runs("testapp.flaky", unique_tag, done=False)) == 2, duration=1.5)
    row.refresh_from_db()
    live = flaky.get_backend().live_state(row.key_hash)
    assert (live["triggers"], live["runs"], live["merged"], live["pending"]) == (2, 1, 1, 0)


def test_retries_are_bounded_then_the_failure_is_recorded(worker, unique_tag):
    flaky.trigger(unique_tag, 10)
    row = key_row(flaky, unique_tag, 10)
    wait_for(
        lambda: outcomes(row) == ["retry", "retry", "failure"],
        timeout=30,
        message="two retries, then the failure",
    )
    assert stays(lambda: len(runs("testapp.flaky", unique_tag, done=False)) == 3, duration=1.5)
    done = runs("testapp.flaky", unique_tag)
    assert [r.payload["attempt"] for r in done] == [0, 1, 2]
    for a, b in zip(done, done[1:], strict=False):
        assert b.started >= a.finished  # no retry overlaps another run of the key
    last = DebounceRun.objects.filter(debounce_key=row).order_by("-run_id").first()
    assert last.error == "RuntimeError: flaky failure 2"
    assert last.attempt == 2
    live = flaky.get_backend().live_state(row.key_hash)
    assert live["state"] == "idle" and live["pending"] == 0
    assert (live["triggers"], live["runs"]) == (1, 1)


def test_retry_called_in_the_body_follows_the_same_path(worker, unique_tag):
    asks_retry.trigger(unique_tag)
    row = key_row(asks_retry, unique_tag)
    wait_for(lambda: outcomes(row) == ["retry", "success"], message="the retry's success")
    done = runs("testapp.asks_retry", unique_tag)
    assert [r.payload["attempt"] for r in done] == [0, 1]
    assert done[1].started >= done[0].finished + 0.25
    failed = DebounceRun.objects.filter(debounce_key=row, outcome="retry").get()
    assert failed.error == "ValueError: not yet"


# -- leases ---------------------------------------------------------------------------------


def test_a_run_longer_than_its_lease_keeps_it_by_heartbeats_and_never_overlaps(worker, unique_tag):
    from tests.testapp.tasks import long_runner  # lease 1.5 s, body 4 s

    long_runner.trigger(unique_tag)
    wait_for(lambda: runs("testapp.long_runner", unique_tag, done=False), message="the run")
    long_runner.trigger(unique_tag)  # during the run: one follow-up after it
    done = wait_for(
        lambda: (r := runs("testapp.long_runner", unique_tag))[1:] and r,
        timeout=30,
        message="the follow-up",
    )
    assert done[1].started >= done[0].finished  # no overlap although the body outlived its lease
    assert stays(lambda: len(runs("testapp.long_runner", unique_tag, done=False)) == 2, duration=2)
    row = key_row(long_runner, unique_tag)
    assert outcomes(row) == ["success", "success"]  # never lost


def test_a_short_lease_is_kept_while_a_run_with_a_long_lease_is_live(worker, unique_tag):
    from tests.testapp.tasks import long_runner  # lease 1.5 s, body 4 s

    # A run whose lease is 20 s is live: the lease keeper must still look at the runs that
    # start meanwhile often enough to keep a 1.5 s lease.
    flaky.trigger(unique_tag, 0, 6.0)  # no failure; the body takes 6 s
    wait_for(lambda: runs("testapp.flaky", unique_tag, done=False), message="the long-lease run")
    # live for a while: the keeper has looked at the active runs since it started
    assert stays(lambda: not runs("testapp.flaky", unique_tag), duration=1.0)
    long_runner.trigger(unique_tag)
    wait_for(lambda: runs("testapp.long_runner", unique_tag, done=False), message="the run")
    long_runner.trigger(unique_tag)  # during the run: one follow-up after it
    done = wait_for(
        lambda: (r := runs("testapp.long_runner", unique_tag))[1:] and r,
        timeout=30,
        message="the follow-up",
    )
    assert done[1].started >= done[0].finished  # the first run's lease was kept: no overlap
    assert stays(lambda: len(runs("testapp.long_runner", unique_tag, done=False)) == 2, duration=2)
    assert outcomes(key_row(long_runner, unique_tag)) == ["success", "success"]  # never lost
    assert outcomes(key_row(flaky, unique_tag, 0, 6.0)) == ["success"]


def test_lease_is_derived_from_the_time_limit(settings):
    settings.DEBOUNCE_LEASE = 300
    assert limited.lease == 7 + 5
    assert flaky.lease == 20  # lease= of the decorator wins
    assert orphan.lease == 300  # no time limit: the setting


# -- the broker -----------------------------------------------------------------------------


def test_eta_message_delivered_twice_by_the_broker_runs_the_body_once(
    celery_worker_session, store, transactional_db, unique_tag, settings
):
    # A flight due within DEBOUNCE_PUMP_INTERVAL goes out at its trigger, as an ETA message
    # (countdown: its wait). With a visibility timeout shorter than that countdown, the Redis
    # transport gives the unacknowledged ETA message to the worker again before it is due.
    settings.DEBOUNCE_PUMP_INTERVAL = eta.wait + 2
    worker = Worker(concurrency=2, queue="debounce-eta", env={"DEBOUNCE_TEST_VISIBILITY": "1"})
    worker.start()
    try:
        result = eta.trigger(unique_tag)
        assert result.scheduled  # published at once, with a countdown of eta.wait
        wait_for(lambda: runs("testapp.eta", unique_tag), timeout=30, message="the run")
        log = worker.log.read_bytes()
        received = len(re.findall(rb"testapp\.eta\[[^\]]+\] received", log))
        assert received >= 2, "the broker did not deliver the message twice"
        assert stays(lambda: len(runs("testapp.eta", unique_tag, done=False)) == 1, duration=2.0)
        (run,) = runs("testapp.eta", unique_tag)
        assert run.triggers == 1
    finally:
        worker.stop()


def pump_stats(app) -> dict[str, dict]:
    """``debounce_stats`` of every worker (Celery remote control), by worker name."""
    replies = app.control.broadcast("debounce_stats", reply=True, timeout=2.0) or []
    return {name: stats for reply in replies for name, stats in reply.items()}


def test_lost_dispatch_message_is_taken_again_by_the_pump_after_the_grace(
    celery_worker_session, store, transactional_db, unique_tag, settings
):
    from tests.celery_app import app

    settings.DEBOUNCE_DISPATCH_GRACE = 1  # here (the take of the trigger) and in the worker
    worker = Worker(
        concurrency=1, queue="debounce-recovery", env={"DEBOUNCE_TEST_DISPATCH_GRACE": "1"}
    )
    worker.start()
    try:
        again_before = sum(st["taken_again"] for st in pump_stats(app).values())
        k, _payload, stored = orphan._resolve((unique_tag,), {})
        # The store counts the trigger and takes the flight for a message due within the pump
        # interval; that message is lost (a crash between the store write and the publish).
        result, dispatch = orphan.get_backend().trigger(
            task_name=orphan.name,
            key=k,
            key_hash=key_hash(orphan.name, k),
            payload_json=stored,
            options=orphan.flight_options(),
        )
        assert dispatch is not None and result.scheduled
        lost_at = time.time()
        done = wait_for(
            lambda: runs("testapp.orphan", unique_tag), timeout=30, message="the run taken again"
        )
        assert done[0].triggers == 1
        # Not before the message counted as lost, and by a pump taking it again (the same
        # sequence number: a duplicate of the lost message, never a second run).
        assert done[0].started >= lost_at + 1.0 - 0.05
        again = sum(st["taken_again"] for st in pump_stats(app).values())
        assert again >= again_before + 1
        assert stays(lambda: len(runs("testapp.orphan", unique_tag, done=False)) == 1, duration=1.5)
    finally:
        worker.stop()
