"""Issue 4 semantics driven on each real store directly with the store's time override (no
worker): heartbeats and leases, retries and their backoff, edges and collected flights; and
run_due in-process. Every test runs on both stores (the ``store`` fixture)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_debounce.backends import get_backend
from django_debounce.keys import dumps
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.state import Finish, FireAction, FlightOptions
from django_debounce.testing import run_due
from tests.support.peek import peek_store, us
from tests.testapp.models import RunLog
from tests.testapp.tasks import batch, flaky

# No worker runs during this module: a session worker left running by earlier modules knows
# some of these tasks (its pump can take their flights).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_workers")]

H = "5" * 64
TASK = "testapp.store_semantics"  # registered nowhere: no live worker's pump takes it
T0 = timezone.now()


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def opts(*, wait: float = 1.0, lease: float = 10.0, **options: Any) -> FlightOptions:
    return FlightOptions(wait=wait, lease=lease, **options)


def trig(backend, payload="x", *, t=0.0, **options):
    """One trigger of ``H`` at ``t`` (a collected item with ``collect_limit``, else the task's
    arguments); returns ``(result, dispatch)``."""
    o = opts(**options)
    return backend.trigger(
        task_name=TASK,
        key="sem",
        key_hash=H,
        payload_json=dumps(payload if o.collect else [payload]),
        options=o,
        now=at(t),
    )


def fire(backend, t, *, seq=None, **options):
    return backend.fire(H, seq, task_name=TASK, options=opts(**options), now=at(t))


def finish(backend, run_id, t, end=None, **options):
    return backend.finish(
        H, run_id, end or Finish(ok=True), task_name=TASK, options=opts(**options), now=at(t)
    )


def take(backend, t, **options):
    """The pump at ``t``: the dispatches it takes for ``H``'s task."""
    return backend.take({TASK: opts(**options)}, 100, now=at(t)).dispatches


def view(store, key_hash=H, task=TASK, collect=False):
    """The key's stored state (``tests/support/peek.py``, as the property test reads it; on
    the Redis store with what the key's counter counted folded in)."""
    return peek_store(get_backend(), key_hash, collect)


def runs_recorded():
    """Outcomes and errors of the key's runs (their ``DebounceRun`` rows)."""
    return list(DebounceRun.objects.order_by("run_id").values_list("outcome", "error"))


def test_a_finish_at_a_clock_earlier_than_its_claim_still_ends_the_run(store):
    # Found porting run_due to the Redis store: run_due claims at the time it is given and
    # the finish after it takes the store's clock, earlier: the run must end all the same
    # (the row idle, the run a success), never stay "running".
    backend = get_backend()
    real = timezone.now()
    backend.trigger(
        task_name=TASK, key="sem", key_hash=H, payload_json=dumps(["x"]), options=opts()
    )
    claim = backend.fire(
        H, None, task_name=TASK, options=opts(), now=real + timedelta(seconds=5)
    ).claim
    assert claim is not None
    backend.finish(H, claim.run_id, Finish(ok=True), task_name=TASK, options=opts())
    assert runs_recorded() == [("success", "")]
    row = DebounceKey.objects.get(key_hash=H)
    assert (row.state, row.pending, row.runs, row.running_until) == ("idle", 0, 1, None)


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
    assert backend.heartbeat(
        H, run.run_id, 2.0, task_name=TASK, options=opts(lease=2.0), now=at(2.5)
    )  # the lease now ends at 4.5
    assert view(store)["running_until"] == us(at(4.5))
    assert view(store)["entry"] == us(at(4.5))  # the lease end is the key's index entry
    assert finish(backend, run.run_id, 4.0, lease=2.0) is None
    assert backend.live_state(H)["state"] == "idle"
    assert view(store)["entry"] is None
    trig(backend, t=5.0)
    run = fire(backend, 6.0, lease=2.0).claim
    assert run is not None
    assert not backend.heartbeat(
        H, run.run_id, 2.0, task_name=TASK, options=opts(lease=2.0), now=at(8.5)
    )  # ran out at 8.0
    follow = finish(backend, run.run_id, 8.6, lease=2.0)
    assert follow is not None and follow.countdown == 0  # the lost run's flight is redone
    live = backend.live_state(H)
    assert (live["state"], live["pending"], live["runs"]) == ("pending", 1, 1)
    assert runs_recorded() == [("success", ""), ("lost", "lease ran out")]


def test_failed_run_goes_back_to_pending_and_a_trigger_in_the_backoff_joins_the_retry(store):
    backend = get_backend()
    trig(backend, "a", t=0)
    run = fire(backend, 1.0).claim
    assert (run.triggers, run.attempt) == (1, 0)
    follow = finish(backend, run.run_id, 1.5, Finish(ok=False, error="E: boom", retry_in=5.0))
    assert follow is None  # due in 5 s, beyond the pump interval: it waits in the due index
    state = view(store)
    assert (state["pending"], state["attempt"]) == (1, 1)
    assert state["not_before"] == state["due"] == state["entry"] == us(at(6.5))
    trig(backend, "b", t=2.0)  # during the backoff: joins, does not run before 6.5
    assert view(store)["due"] == us(at(6.5))
    decision = fire(backend, 4.0)  # an in-process claim in the backoff: back to the index
    assert decision.action is FireAction.REARM and decision.dispatch is None
    assert take(backend, 6.5 - 1e-6) == []  # the pump: not due yet
    (message,) = take(backend, 6.5)
    assert fire(backend, 6.5, seq=message.seq + 1).action is FireAction.DROP  # not its message
    retry = fire(backend, 6.6, seq=message.seq).claim
    assert (retry.triggers, retry.attempt, retry.payload) == (2, 1, ["b"])
    finish(backend, retry.run_id, 7.0)
    live = backend.live_state(H)
    assert (live["triggers"], live["runs"], live["merged"], live["pending"]) == (2, 1, 1, 0)
    assert runs_recorded() == [("retry", "E: boom"), ("success", "")]


def test_a_short_backoff_is_published_by_the_finishing_run(store):
    # A retry due within the pump interval goes out with the finish, with its countdown.
    backend = get_backend()
    trig(backend, "a", t=0)
    run = fire(backend, 1.0).claim
    follow = finish(backend, run.run_id, 1.5, Finish(ok=False, error="E", retry_in=0.4))
    assert follow is not None and follow.countdown == pytest.approx(0.4)
    early = fire(backend, 1.6, seq=follow.seq)  # delivered early (a broker that ignores ETAs)
    assert early.action is FireAction.REARM and early.dispatch is not None
    assert early.dispatch.countdown == pytest.approx(0.3)
    assert fire(backend, 1.9, seq=early.dispatch.seq).claim.attempt == 1


def test_final_failure_is_recorded_and_the_key_is_idle(store):
    backend = get_backend()
    trig(backend, t=0)
    run = fire(backend, 1.0).claim
    assert finish(backend, run.run_id, 1.5, Finish(ok=False, error="E: last")) is None
    live = backend.live_state(H)
    assert (live["state"], live["pending"], live["runs"], live["triggers"]) == ("idle", 0, 1, 1)
    assert view(store)["entry"] is None
    assert runs_recorded() == [("failure", "E: last")]


def test_leading_edge_is_due_at_once_and_later_triggers_do_not_delay_it(store):
    backend = get_backend()
    result, dispatch = trig(backend, t=0, leading=True)
    assert dispatch.countdown == 0 and result.due_at == at(0) and result.scheduled
    merged, none = trig(backend, t=0.1, leading=True)
    # a trigger a Redis counter merged reports no due time (the row keeps at(0))
    assert none is None and merged.due_at in (at(0), None) and not merged.scheduled
    assert view(store)["due"] == us(at(0))
    assert fire(backend, 0.2, seq=dispatch.seq, leading=True).claim.triggers == 2
    # within wait of the last trigger: a trailing flight, due wait after it
    result, dispatch = trig(backend, t=0.5, leading=True)
    assert result.due_at == at(1.5) and dispatch is None  # the run is live: its finish decides


def test_trailing_false_drops_triggers_in_the_window_and_counts_them(store):
    backend = get_backend()
    edge = {"leading": True, "trailing": False}
    trig(backend, t=0, **edge)
    finish(backend, fire(backend, 0.1, **edge).claim.run_id, 0.2, **edge)
    dropped, dispatch = trig(backend, t=0.5, **edge)
    assert dispatch is None and dropped.pending == 0
    dropped, dispatch = trig(backend, t=1.4, **edge)  # extends the window
    assert dispatch is None and dropped.pending == 0
    assert view(store)["entry"] is None  # nothing to do: no index entry
    again, dispatch = trig(backend, t=2.5, **edge)  # quiet >= wait
    assert dispatch is not None and again.pending == 1
    live = backend.live_state(H)
    assert (live["triggers"], live["cancelled"], live["pending"]) == (4, 2, 1)


def test_collected_flight_runs_at_once_when_full_and_keeps_the_rest(store):
    backend = get_backend()
    sent = []
    for i, item in enumerate([1, 2, 1, 3]):
        sent.append(trig(backend, item, t=i * 0.1, collect_limit=3)[1])
    assert sent[0] is not None and sent[0].countdown == 1.0  # within the pump interval
    assert sent[1:3] == [None, None]  # its message is out (1 again: not a new item)
    dispatch = sent[3]
    assert dispatch is not None and dispatch.countdown == 0  # full at the third item
    assert fire(backend, 0.35, seq=sent[0].seq, collect_limit=3).action is FireAction.DROP
    for i, item in enumerate([4, 5]):
        trig(backend, item, t=0.5 + i * 0.1, collect_limit=3)
    run = fire(backend, 0.8, seq=dispatch.seq, collect_limit=3).claim
    assert run.payload == [1, 2, 3] and run.triggers == 4
    live = backend.live_state(H)
    assert live["pending"] == 2  # items 4 and 5, one trigger each
    follow = finish(backend, run.run_id, 0.9, collect_limit=3)
    assert follow is not None
    assert fire(backend, 2.0, seq=follow.seq, collect_limit=3).claim.payload == [4, 5]


def test_run_due_retries_in_process_and_collects(store, settings, in_process):
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
    # run_due wrote the run rows
    assert DebounceKey.objects.filter(state="idle").count() == 2
    assert list(DebounceRun.objects.order_by("started_at").values_list("outcome", flat=True)) == [
        "retry",
        "success",
        "success",
    ]


def test_celery_autoretry_for_takes_the_debounce_retry_path(store, settings, in_process):
    from tests.testapp.tasks import auto_retry

    settings.DEBOUNCE_ON_COMMIT = False
    auto_retry.trigger("ar")
    with pytest.raises(KeyError):
        run_due(now=timezone.now() + timedelta(seconds=1))
    (row,) = DebounceKey.objects.all()
    state = view(store, row.key_hash, auto_retry.name)
    assert (state["pending"], state["attempt"]) == (1, 1)
    # retry_backoff=2, no jitter, first retry: 2 s (Celery's get_exponential_backoff_interval)
    failed = DebounceRun.objects.get()
    assert state["due"] - us(failed.finished_at) == pytest.approx(2_000_000, abs=10_000)
    assert state["entry"] == state["due"]  # beyond the pump interval: in the due index
    with pytest.raises(KeyError):
        run_due(now=timezone.now() + timedelta(seconds=10))
    state = view(store, row.key_hash, auto_retry.name)
    # max_retries=1: then failure
    assert (state["pending"], state["runs"], state["running_until"]) == (0, 1, None)
    assert list(DebounceRun.objects.order_by("run_id").values_list("outcome", flat=True)) == [
        "retry",
        "failure",
    ]


def test_autoretry_for_narrows_which_exceptions_retry(store, settings, in_process):
    from tests.testapp.tasks import auto_retry

    settings.DEBOUNCE_ON_COMMIT = False
    auto_retry.trigger("value-error")
    with pytest.raises(ValueError):
        run_due(now=timezone.now() + timedelta(seconds=1))
    (row,) = DebounceKey.objects.all()
    state = view(store, row.key_hash, auto_retry.name)
    assert (state["pending"], state["attempt"], state["running_until"]) == (0, 0, None)
    assert DebounceRun.objects.get().outcome == "failure"


def test_runs_lost_with_their_worker_count_as_attempts_and_are_given_up(
    store, settings, in_process
):
    settings.DEBOUNCE_ON_COMMIT = False
    flaky.trigger("lost", 0)  # would succeed, but every worker dies mid-run (max_retries=2)
    backend = get_backend()
    (row,) = DebounceKey.objects.all()
    base = timezone.now()
    options = flaky.flight_options()
    assert options.lease == 20
    for i in range(3):  # claimed and abandoned three times: lease (20 s) runs out each time
        claim = backend.fire(
            row.key_hash,
            None,
            task_name=flaky.name,
            options=options,
            now=base + timedelta(seconds=1 + 30 * i),
        )
        assert claim.claim is not None and claim.claim.attempt == i
    assert run_due(now=base + timedelta(seconds=95)) == 1  # claims, but gives up
    assert not RunLog.objects.exists()  # the body did not run a fourth time
    state = view(store, row.key_hash, flaky.name)
    assert (state["pending"], state["runs"], state["running_until"]) == (0, 1, None)
    last = DebounceRun.objects.order_by("-run_id").first()
    assert last.outcome == "failure" and "given up after 3 attempts" in last.error
    assert list(DebounceRun.objects.order_by("run_id").values_list("outcome", flat=True)) == [
        "lost",
        "lost",
        "lost",
        "failure",
    ]


def test_run_due_runs_every_batch_and_collect_flush_needs_no_item(store, settings, in_process):
    settings.DEBOUNCE_ON_COMMIT = False
    for n in range(12):
        batch.trigger({"tag": "all", "n": n})
    assert run_due(now=timezone.now() + timedelta(seconds=1)) == 3  # 5 + 5 + 2 items
    assert sorted(n for log in RunLog.objects.all() for n in log.payload) == list(range(12))
