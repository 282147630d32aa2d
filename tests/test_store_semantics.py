"""Issue 4 semantics driven on each real store directly with the store's time override (no
worker): heartbeats and leases, retries, edges and collected flights; and run_due in-process."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_debounce.backends import get_backend
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.state import FireAction
from django_debounce.testing import run_due
from tests.testapp.models import RunLog
from tests.testapp.tasks import batch, flaky

pytestmark = pytest.mark.django_db(transaction=True)

H = "s" * 64
T0 = timezone.now()


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def trig(backend, payload="x", *, t=0.0, wait=1.0, max_wait=None, **options):
    return backend.trigger(
        task_name="testapp.record",
        key="sem",
        key_hash=H,
        payload=payload if options.get("collect_limit") else {"args": [payload], "kwargs": {}},
        wait=wait,
        max_wait=max_wait,
        now=at(t),
        **options,
    )


def fire(backend, t, *, lease=10.0, seq=None, **options):
    return backend.fire(H, seq, overlap=False, lease=lease, now=at(t), **options)


@pytest.fixture
def in_process():
    """Celery's eager mode: triggers publish no message, so a worker left running by other
    tests cannot claim the flights that these tests run with run_due()."""
    from tests.celery_app import app

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def test_heartbeat_extends_the_lease_and_a_finish_after_it_ran_out_changes_nothing(store):
    backend = get_backend()
    trig(backend, t=0)
    run = fire(backend, 1.0, lease=2.0).claim
    assert run is not None
    assert backend.heartbeat(H, run.run_id, 2.0, now=at(2.5)) is True  # lease now ends at 4.5
    assert backend.finish(H, run.run_id, ok=True, now=at(4.0)) is None
    assert backend.live_state(H)["state"] == "idle"
    trig(backend, t=5.0)
    run = fire(backend, 6.0, lease=2.0).claim
    assert backend.heartbeat(H, run.run_id, 2.0, now=at(8.5)) is False  # ran out at 8.0
    follow = backend.finish(H, run.run_id, ok=True, now=at(8.6))
    assert follow is not None and follow.kind == "fire"  # the lost run's flight is redone
    live = backend.live_state(H)
    assert (live["state"], live["pending"], live["runs"]) == ("pending", 1, 1)
    assert DebounceRun.objects.get(run_id=run.run_id).outcome == "lost"


def test_failed_run_goes_back_to_pending_and_a_trigger_in_the_backoff_joins_the_retry(store):
    backend = get_backend()
    trig(backend, "a", t=0)
    run = fire(backend, 1.0).claim
    assert (run.triggers, run.attempt) == (1, 0)
    follow = backend.finish(H, run.run_id, ok=False, error="E: boom", retry_in=5.0, now=at(1.5))
    assert follow is not None and follow.countdown == pytest.approx(5.0)
    trig(backend, "b", t=2.0)  # during the backoff: joins, does not run before 6.5
    assert fire(backend, 4.0, seq=follow.seq).action is FireAction.REARM
    retry = fire(backend, 6.5).claim
    assert (retry.triggers, retry.attempt, retry.payload["args"]) == (2, 1, ["b"])
    backend.finish(H, retry.run_id, ok=True, now=at(7.0))
    live = backend.live_state(H)
    assert (live["triggers"], live["runs"], live["merged"], live["pending"]) == (2, 1, 1, 0)
    assert list(DebounceRun.objects.order_by("run_id").values_list("outcome", "error")) == [
        ("retry", "E: boom"),
        ("success", ""),
    ]


def test_final_failure_is_recorded_and_the_key_is_idle(store):
    backend = get_backend()
    trig(backend, t=0)
    run = fire(backend, 1.0).claim
    assert backend.finish(H, run.run_id, ok=False, error="E: last", now=at(1.5)) is None
    live = backend.live_state(H)
    assert (live["state"], live["pending"], live["runs"], live["triggers"]) == ("idle", 0, 1, 1)
    assert DebounceRun.objects.get().outcome == "failure"


def test_leading_edge_is_due_at_once_and_later_triggers_do_not_delay_it(store):
    backend = get_backend()
    result, dispatch, _ = trig(backend, t=0, leading=True)
    assert dispatch.countdown == 0 and result.due_at == at(0)
    merged, none, _ = trig(backend, t=0.1, leading=True)
    assert none is None and merged.due_at == at(0)
    assert fire(backend, 0.2).claim.triggers == 2
    # within wait of the last trigger: a trailing flight, due wait after it
    result, _, _ = trig(backend, t=0.5, leading=True)
    assert result.due_at == at(1.5)


def test_trailing_false_drops_triggers_in_the_window_and_counts_them(store):
    backend = get_backend()
    trig(backend, t=0, leading=True, trailing=False)
    backend.finish(H, fire(backend, 0.1).claim.run_id, ok=True, now=at(0.2))
    dropped, dispatch, _ = trig(backend, t=0.5, leading=True, trailing=False)
    assert dispatch is None and dropped.pending == 0
    dropped, dispatch, _ = trig(backend, t=1.4, leading=True, trailing=False)  # extends window
    assert dispatch is None
    again, dispatch, _ = trig(backend, t=2.5, leading=True, trailing=False)  # quiet >= wait
    assert dispatch is not None and again.pending == 1
    live = backend.live_state(H)
    assert (live["triggers"], live["cancelled"], live["pending"]) == (4, 2, 1)


def test_collected_flight_runs_at_once_when_full_and_keeps_the_rest(store):
    backend = get_backend()
    for i, item in enumerate([1, 2, 1, 3]):
        _r, dispatch, _ = trig(backend, item, t=i * 0.1, collect_limit=3)
    assert dispatch is not None and dispatch.countdown == 0  # full at the third item
    for i, item in enumerate([4, 5]):
        trig(backend, item, t=0.5 + i * 0.1, collect_limit=3)
    run = fire(backend, 0.8, collect_limit=3).claim
    assert run.payload == [1, 2, 3] and run.triggers == 4
    live = backend.live_state(H)
    assert live["pending"] == 2  # items 4 and 5, one trigger each
    follow = backend.finish(H, run.run_id, ok=True, now=at(0.9))
    assert follow is not None
    assert fire(backend, 2.0, collect_limit=3).claim.payload == [4, 5]


def test_run_due_retries_in_process_and_collects(settings, in_process):
    settings.DEBOUNCE_BACKEND = "database"
    settings.DEBOUNCE_ON_COMMIT = False
    flaky.trigger("inproc", 1)
    with pytest.raises(RuntimeError, match="flaky failure 0"):
        run_due(now=timezone.now() + timedelta(seconds=1))
    assert run_due(now=timezone.now() + timedelta(seconds=0.5)) == 0  # the backoff (1 s) holds
    assert run_due(now=timezone.now() + timedelta(seconds=3)) == 1
    assert [log.payload["attempt"] for log in RunLog.objects.order_by("started")] == [0, 1]
    batch.trigger({"tag": "inproc", "n": 1})
    batch.trigger({"tag": "inproc", "n": 2})
    assert run_due(now=timezone.now() + timedelta(seconds=1)) == 1
    assert RunLog.objects.get(task="testapp.batch").payload == [1, 2]
    assert DebounceKey.objects.filter(state="idle").count() == 2


def test_celery_autoretry_for_takes_the_debounce_retry_path(settings, in_process):
    from tests.testapp.tasks import auto_retry

    settings.DEBOUNCE_BACKEND = "database"
    settings.DEBOUNCE_ON_COMMIT = False
    auto_retry.trigger("ar")
    with pytest.raises(KeyError):
        run_due(now=timezone.now() + timedelta(seconds=1))
    row = DebounceKey.objects.get()
    assert (row.pending, row.attempt) == (1, 1)
    # retry_backoff=2, no jitter, first retry: 2 s (Celery's get_exponential_backoff_interval)
    failed = DebounceRun.objects.get()
    assert (row.due_at - failed.finished_at).total_seconds() == pytest.approx(2.0, abs=0.01)
    with pytest.raises(KeyError):
        run_due(now=timezone.now() + timedelta(seconds=10))
    row.refresh_from_db()
    assert (row.state, row.pending, row.runs) == ("idle", 0, 1)  # max_retries=1: then failure
    assert list(DebounceRun.objects.order_by("run_id").values_list("outcome", flat=True)) == [
        "retry",
        "failure",
    ]


def test_autoretry_for_narrows_which_exceptions_retry(settings, in_process):
    from tests.testapp.tasks import auto_retry

    settings.DEBOUNCE_BACKEND = "database"
    settings.DEBOUNCE_ON_COMMIT = False
    auto_retry.trigger("value-error")
    with pytest.raises(ValueError):
        run_due(now=timezone.now() + timedelta(seconds=1))
    row = DebounceKey.objects.get()
    assert (row.state, row.pending, row.attempt) == ("idle", 0, 0)
    assert DebounceRun.objects.get().outcome == "failure"


def test_runs_lost_with_their_worker_count_as_attempts_and_are_given_up(settings, in_process):
    settings.DEBOUNCE_BACKEND = "database"
    settings.DEBOUNCE_ON_COMMIT = False
    flaky.trigger("lost", 0)  # would succeed, but every worker dies mid-run (max_retries=2)
    backend = get_backend("database")
    (row,) = DebounceKey.objects.all()
    base = timezone.now()
    for i in range(3):  # claimed and abandoned three times: lease (20 s) runs out each time
        claim = backend.fire(
            row.key_hash, None, overlap=False, lease=20, now=base + timedelta(seconds=1 + 30 * i)
        )
        assert claim.claim is not None and claim.claim.attempt == i
    assert run_due(now=base + timedelta(seconds=95)) == 1  # claims, but gives up
    assert not RunLog.objects.exists()  # the body did not run a fourth time
    row.refresh_from_db()
    assert (row.state, row.pending, row.runs) == ("idle", 0, 1)
    last = DebounceRun.objects.order_by("-run_id").first()
    assert last.outcome == "failure" and "given up after 3 attempts" in last.error
    assert list(DebounceRun.objects.order_by("run_id").values_list("outcome", flat=True)) == [
        "lost",
        "lost",
        "lost",
        "failure",
    ]


def test_run_due_runs_every_batch_and_collect_flush_needs_no_item(settings, in_process):
    settings.DEBOUNCE_BACKEND = "database"
    settings.DEBOUNCE_ON_COMMIT = False
    for n in range(12):
        batch.trigger({"tag": "all", "n": n})
    assert run_due(now=timezone.now() + timedelta(seconds=1)) == 3  # 5 + 5 + 2 items
    assert sorted(n for log in RunLog.objects.all() for n in log.payload) == list(range(12))
