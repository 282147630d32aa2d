"""Edge sequences of the state machine, driven on each real store directly (no worker):
a publish that fails while other triggers merge, and a lease lost just after a trigger."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from django_debounce.backends import get_backend
from django_debounce.keys import dumps
from django_debounce.state import FireAction

pytestmark = pytest.mark.django_db(transaction=True)

H = "e" * 64


def trig(backend, payload, *, wait=0.3, key_hash=H, max_wait=None, **options):
    """One trigger of the key ``H`` of testapp.record; ``options`` go to the store as they are
    (``leading``, ``overlap``, ``now``, ...)."""
    return backend.trigger(
        task_name="testapp.record",
        key="edge",
        key_hash=key_hash,
        payload={"args": [payload], "kwargs": {}},
        wait=wait,
        max_wait=max_wait,
        **options,
    )


def test_abort_keeps_a_trigger_that_merged_while_the_publish_failed(store):
    backend = get_backend()
    _a, dispatch_a, undo_a = trig(backend, "a")
    _b, dispatch_b, _undo_b = trig(backend, "b")
    assert dispatch_a is not None and dispatch_b is None  # b merged: "a message is out"
    backend.abort_trigger(H, dispatch_a.seq, {**undo_a, "kind": dispatch_a.kind})
    live = backend.live_state(H)
    assert (live["pending"], live["triggers"]) == (1, 1)
    # b is not stranded: recovery publishes a message for it, and its run gets b's payload
    ((task_name, dispatch),) = backend.recover(grace=60)
    assert task_name == "testapp.record" and dispatch.key_hash == H
    decision = backend.fire(H, dispatch.seq, overlap=False, lease=60, store=dispatch.store)
    while decision.action is FireAction.REARM:
        time.sleep(decision.dispatch.countdown)  # the flight's own quiet period
        decision = backend.fire(H, decision.dispatch.seq, overlap=False, lease=60)
    assert decision.action is FireAction.CLAIM
    assert decision.claim.payload == {"args": ["b"], "kwargs": {}}
    assert decision.claim.triggers == 1


def test_abort_of_the_only_trigger_leaves_no_flight(store):
    backend = get_backend()
    _a, dispatch, undo = trig(backend, "a")
    backend.abort_trigger(H, dispatch.seq, {**undo, "kind": dispatch.kind})
    live = backend.live_state(H)
    assert (live["pending"], live["triggers"], live["flight_id"]) == (0, 0, 0)
    _again, dispatch_again, _undo = trig(backend, "a2")
    assert dispatch_again is not None  # the next trigger publishes afresh (I8)


def test_abort_of_a_watchdog_trigger_keeps_the_later_trigger_and_its_quiet_period(store):
    backend = get_backend()
    trig(backend, "a", wait=0)
    claim = backend.fire(H, None, overlap=False, lease=60).claim
    assert claim is not None
    _b, watchdog, undo_b = trig(backend, "b", wait=5)  # during the run: a lease watchdog
    assert watchdog is not None and watchdog.kind == "watch"
    _c, dispatch_c, _undo_c = trig(backend, "c", wait=5)
    assert dispatch_c is None  # merged: the watchdog is parked
    backend.abort_trigger(H, watchdog.seq, {**undo_b, "kind": "watch"})
    assert backend.live_state(H)["pending"] == 1
    follow = backend.finish(H, claim.run_id, ok=True)
    assert follow is not None and follow.kind == "fire"
    assert follow.countdown > 3  # c's quiet period of 5 s, not at once


def test_abort_of_a_watchdog_trigger_whose_flight_ran_meanwhile_keeps_the_next_flight(store):
    # The publish of a trigger's lease watchdog is slow to fail; meanwhile the run finishes,
    # the trigger's flight runs, and a new trigger opens the next flight. The watchdog is
    # still parked (it outlives its run), so taking the first trigger back used to take the
    # new one instead: its flight closed and it never ran (I1).
    backend = get_backend()
    t0 = timezone.now()

    def at(seconds):
        return t0 + timedelta(seconds=seconds)

    trig(backend, "a", wait=0, now=at(0))
    first = backend.fire(H, None, overlap=False, lease=60, now=at(0.1)).claim
    assert first is not None
    _b, watchdog, undo_b = trig(backend, "b", wait=0, now=at(1))
    assert watchdog is not None and watchdog.kind == "watch"
    follow = backend.finish(H, first.run_id, ok=True, now=at(2))
    assert follow is not None and follow.kind == "fire"
    second = backend.fire(H, follow.seq, overlap=False, lease=60, now=at(3)).claim
    assert second is not None and second.payload == {"args": ["b"], "kwargs": {}}
    _c, merged, _undo_c = trig(backend, "c", wait=0, now=at(4))
    assert merged is None  # the watchdog parked for the first run's lease covers c
    backend.abort_trigger(H, watchdog.seq, {**undo_b, "kind": "watch"})  # b already ran
    live = backend.live_state(H)
    assert (live["pending"], live["triggers"], live["flight_id"]) == (1, 3, 3)
    follow = backend.finish(H, second.run_id, ok=True, now=at(5))
    assert follow is not None
    third = backend.fire(H, follow.seq, overlap=False, lease=60, now=at(6)).claim
    assert third is not None and third.payload == {"args": ["c"], "kwargs": {}}


def test_lease_lost_just_after_a_trigger_keeps_that_trigger_quiet_period(store):
    backend = get_backend()
    trig(backend, "a", wait=0)
    claim = backend.fire(H, None, overlap=False, lease=0.5).claim
    assert claim is not None
    lease_end = time.monotonic() + 0.5
    time.sleep(max(0.0, lease_end - 0.15 - time.monotonic()))
    trig(backend, "b", wait=1.0)  # due about 0.85 s after the lease ends
    time.sleep(max(0.0, lease_end + 0.1 - time.monotonic()))
    backend.recover(grace=60)  # the run is lost: its trigger goes back to pending
    decision = backend.fire(H, None, overlap=False, lease=60)
    assert decision.action is FireAction.REARM  # not claimed before b's due time (I3)
    assert decision.dispatch.countdown > 0.3


def collect(backend, item, *, limit=10):
    return backend.trigger(
        task_name="testapp.record",
        key="edge",
        key_hash=H,
        payload=item,
        payload_json=dumps(item),
        wait=0.3,
        max_wait=None,
        collect_limit=limit,
    )


def claim_all(backend):
    later = timezone.now() + timedelta(seconds=5)
    decision = backend.fire(H, None, overlap=False, lease=60, now=later, collect_limit=10)
    assert decision.action is FireAction.CLAIM
    return decision.claim


def test_abort_keeps_an_item_that_a_merged_trigger_sent_again(store):
    # Found by the property test: a collected item 5 whose trigger's publish failed was
    # removed although a trigger that merged meanwhile had sent 5 again; that trigger's
    # item was lost (I1). The item stays now; an item no one sent again still goes (I8).
    backend = get_backend()
    _a, dispatch, undo = collect(backend, 5)
    collect(backend, 7)
    collect(backend, 5)  # merged: 5 is already in the flight
    backend.abort_trigger(H, dispatch.seq, {**undo, "kind": dispatch.kind})
    assert backend.live_state(H)["pending"] == 2
    claim = claim_all(backend)
    assert sorted(claim.payload) == [5, 7] and claim.triggers == 2


def test_abort_removes_the_item_no_merged_trigger_sent_again(store):
    backend = get_backend()
    _a, dispatch, undo = collect(backend, 5)
    collect(backend, 7)
    backend.abort_trigger(H, dispatch.seq, {**undo, "kind": dispatch.kind})
    claim = claim_all(backend)
    assert claim.payload == [7] and claim.triggers == 1


def test_collected_items_keep_trigger_order_after_an_abort(store):
    # Found by the property test (Redis): items were scored by the trigger total, which an
    # abort takes back, so the item after an abort could tie with an earlier one and Redis
    # ordered ties by text: "1" before "10".
    backend = get_backend()
    _a, dispatch, undo = collect(backend, "a")
    collect(backend, 2)
    collect(backend, 10)
    backend.abort_trigger(H, dispatch.seq, {**undo, "kind": dispatch.kind})
    collect(backend, 1)
    assert claim_all(backend).payload == [2, 10, 1]


def test_a_trigger_that_makes_the_flight_due_before_its_message_publishes(store):
    # Found by the property test: the hot paths (Redis's merge in Lua, the one-statement
    # UPDATE on PostgreSQL) merged a trigger whose flight is due (its anchor + max_wait)
    # before the outstanding message, here the one a finishing run published for "now",
    # after the flight's due time; the full path publishes a message for the earlier time,
    # as the contract says (scheduled_at > due).
    backend = get_backend()

    def trigger(value):
        return trig(backend, value, wait=0.2, max_wait=0.2)

    _r, first, _u = trigger(1)
    time.sleep(0.25)
    claim = backend.fire(H, first.seq, overlap=False, lease=60).claim
    assert claim is not None
    trigger(2)  # during the run: due 0.2 s later, scheduled by the finishing run
    time.sleep(0.3)
    assert backend.finish(H, claim.run_id, ok=True) is not None  # a message for now
    time.sleep(0.05)
    result, dispatch, _undo = trigger(3)  # due at first + max_wait: before that message
    assert dispatch is not None and dispatch.kind == "fire" and dispatch.countdown == 0
    assert result.scheduled


def test_a_watchdog_parked_for_a_retried_run_serves_the_next_run(store):
    # Found by the property test (Redis): a retry (or a lost lease) forgot the watchdog parked
    # for the run's lease end, so a trigger during the next run published a second one. The
    # parked one still arrives and re-arms for the live run: no second watchdog is needed.
    backend = get_backend()
    trig(backend, "a", wait=0)
    first = backend.fire(H, None, overlap=False, lease=60).claim
    _b, watchdog, _undo = trig(backend, "b", wait=0)
    assert watchdog is not None and watchdog.kind == "watch"
    follow = backend.finish(H, first.run_id, ok=False, retry_in=0)
    assert follow is not None
    second = backend.fire(H, follow.seq, overlap=False, lease=60).claim
    assert second is not None and second.triggers == 2
    _c, dispatch, _undo = trig(backend, "c", wait=0)
    assert dispatch is None  # the parked watchdog covers the live run
    # it arrives after both leases ran out (a dead worker): the flight is redone (I7)
    redo = backend.watch(H, watchdog.seq, now=timezone.now() + timedelta(seconds=61))
    assert redo is not None and redo.kind == "fire"


def test_abort_of_a_flight_opening_trigger_keeps_the_last_trigger_time(store):
    # Found by the property test: taking back the trigger that opened a flight cleared the
    # key's last trigger time, so with leading=True the next trigger, inside the wait of the
    # key's real last trigger, ran at once as a leading edge; as if the aborted trigger had
    # not been made (I8), it opens a trailing flight.
    backend = get_backend()

    def trigger(value):
        return trig(backend, value, wait=5, leading=True)

    _a, leading, _undo = trigger("a")
    assert leading is not None and leading.countdown == 0
    claim = backend.fire(H, leading.seq, overlap=False, lease=60).claim
    assert claim is not None
    backend.finish(H, claim.run_id, ok=True)
    _b, dispatch, undo = trigger("b")  # inside the window: a trailing flight
    assert dispatch is not None and dispatch.countdown > 3
    backend.abort_trigger(H, dispatch.seq, {**undo, "kind": dispatch.kind})
    _c, again, _undo = trigger("c")
    assert again is not None and again.countdown > 3  # trailing still, not a leading edge


def test_a_finish_after_the_lease_keeps_the_run_lost(store):
    # Found by the property test (database store): a finish that found the run's lease run
    # out recovered the lease (its triggers back to pending) and then returned without
    # saving the row, so the key stayed "running" on an expired lease.
    backend = get_backend()
    trig(backend, "a", wait=0)
    start = timezone.now() + timedelta(seconds=1)
    claim = backend.fire(H, None, overlap=False, lease=1, now=start).claim
    assert claim is not None
    late = start + timedelta(seconds=2)
    follow = backend.finish(H, claim.run_id, ok=True, now=late)
    assert follow is not None and follow.kind == "fire"  # the recovered flight's message
    live = backend.live_state(H)
    assert (live["state"], live["pending"], live["runs"]) == ("pending", 1, 0)


def test_a_lost_run_rejoining_a_flight_does_not_cut_a_newer_trigger_quiet_period(store):
    # Found by the property test: a lost run's triggers rejoin the open flight with their
    # older first trigger time; the next trigger then computed first + max_wait from it and
    # made the flight due before the due time already given to a newer trigger (I3). A
    # flight's due time never moves earlier with a later trigger now.
    backend = get_backend()
    t0 = timezone.now()

    def trigger(value, at):
        return trig(
            backend, value, wait=2, max_wait=3.5, overlap=True, now=t0 + timedelta(seconds=at)
        )

    trigger("a", 0)
    claim = backend.fire(H, None, overlap=True, lease=1, now=t0 + timedelta(seconds=2)).claim
    assert claim is not None  # run 1, lease until t0 + 3; its worker dies
    b, _d, _u = trigger("b", 2.5)  # a new flight during the run (overlap), due at t0 + 4.5
    c, _d, _u = trigger("c", 3.5)  # run 1 is lost first: "a" rejoins, with its first time
    assert c.due_at >= b.due_at
    decision = backend.fire(H, None, overlap=True, lease=1, now=t0 + timedelta(seconds=3.6))
    assert decision.action is FireAction.REARM  # not before b's due time


def test_a_heartbeat_at_the_lease_end_is_too_late(store):
    # Found by the property test: at now == running_until every operation counts the lease
    # as run out (the run is lost), but heartbeat still extended it.
    backend = get_backend()
    trig(backend, "a", wait=0)
    start = timezone.now() + timedelta(seconds=1)
    claim = backend.fire(H, None, overlap=False, lease=1, now=start).claim
    assert claim is not None
    end = start + timedelta(seconds=1)
    assert not backend.heartbeat(H, claim.run_id, 1, now=end)
    assert backend.heartbeat(H, claim.run_id, 1, now=end - timedelta(microseconds=1))


def test_recover_at_the_lease_end_redoes_the_run(store):
    # Found by the property test (database store): recover() looked for leases that ran out
    # with running_until < now, so at exactly the lease end (when every operation counts
    # the run as lost) it skipped the key.
    backend = get_backend()
    trig(backend, "a", wait=0)
    start = timezone.now() + timedelta(seconds=1)
    claim = backend.fire(H, None, overlap=False, lease=1, now=start).claim
    assert claim is not None
    ((_task, dispatch),) = backend.recover(grace=60, now=start + timedelta(seconds=1))
    assert dispatch.kind == "fire" and dispatch.countdown == 0
    assert backend.live_state(H)["state"] == "pending"


def test_recover_with_a_long_grace_leaves_overdue_messages_to_the_next_trigger(store):
    # recover(grace=...) of the purge command may be longer than DEBOUNCE_DISPATCH_GRACE;
    # the Redis store kept the hot path's "merge until" from recover's grace, so a trigger
    # after DISPATCH_GRACE merged into a flight whose message is overdue instead of
    # publishing a new one, as the full path (and the database store) do.
    from django.test import override_settings

    with override_settings(DEBOUNCE_DISPATCH_GRACE=5):
        backend = get_backend()
        t0 = timezone.now()
        backend.trigger(
            task_name="testapp.record",
            key="edge",
            key_hash=H,
            payload={"args": ["a"], "kwargs": {}},
            wait=1,
            max_wait=None,
            now=t0,
        )  # its message, due at t0 + 1, is lost
        assert backend.recover(grace=60, now=t0 + timedelta(seconds=2)) == []  # not overdue
        _r, dispatch, _u = backend.trigger(
            task_name="testapp.record",
            key="edge",
            key_hash=H,
            payload={"args": ["b"], "kwargs": {}},
            wait=1,
            max_wait=None,
            now=t0 + timedelta(seconds=7),
        )
        assert dispatch is not None  # the message is overdue by DISPATCH_GRACE: publish anew


def test_abort_after_a_retry_rejoined_the_flight_keeps_the_run_items(store):
    # A run's retry can land between a trigger and the abort of its failed publish: the
    # run's items rejoin the flight. The database store then put back the item list from
    # before the trigger and lost the run's items (I1); only the aborted item goes now.
    backend = get_backend()
    t0 = timezone.now()

    def item(value, at):
        return backend.trigger(
            task_name="testapp.record",
            key="edge",
            key_hash=H,
            payload=value,
            payload_json=dumps(value),
            wait=1,
            max_wait=None,
            overlap=True,
            collect_limit=10,
            now=t0 + timedelta(seconds=at),
        )

    def at(seconds):
        return t0 + timedelta(seconds=seconds)

    item("x", 0)
    run = backend.fire(H, None, overlap=True, lease=600, now=at(1), collect_limit=10).claim
    assert run is not None and run.payload == ["x"]
    item("w", 1.1)  # a flight of its own (overlap); its message goes missing
    _y, dispatch, undo = item("y", 90)  # w's message is overdue: y publishes anew, and fails
    assert dispatch is not None
    backend.finish(H, run.run_id, ok=False, retry_in=0, now=at(90.1))  # "x" rejoins
    backend.abort_trigger(H, dispatch.seq, {**undo, "kind": dispatch.kind})
    claim = backend.fire(H, None, overlap=True, lease=600, now=at(95), collect_limit=10).claim
    assert claim is not None
    assert claim.payload == ["x", "w"] and claim.triggers == 2


def test_abort_after_a_retry_rejoined_the_flight_keeps_the_runs_same_item(store):
    # As above, the aborted trigger's item being the run's own: the item the trigger added
    # came back with the run's trigger, which still needs it. It used to go all the same
    # (nothing came after the aborted trigger), and the run's trigger was never run (I1).
    backend = get_backend()
    t0 = timezone.now()

    def item(value, at):
        return backend.trigger(
            task_name="testapp.record",
            key="edge",
            key_hash=H,
            payload=value,
            payload_json=dumps(value),
            wait=1,
            max_wait=None,
            overlap=True,
            collect_limit=10,
            now=t0 + timedelta(seconds=at),
        )

    def at(seconds):
        return t0 + timedelta(seconds=seconds)

    item("x", 0)
    run = backend.fire(H, None, overlap=True, lease=600, now=at(1), collect_limit=10).claim
    assert run is not None and run.payload == ["x"]
    item("w", 1.1)  # a flight of its own (overlap); its message goes missing
    _x, dispatch, undo = item("x", 90)  # adds "x" again, publishes anew (overdue), and fails
    assert dispatch is not None
    backend.finish(H, run.run_id, ok=False, retry_in=0, now=at(90.1))  # the run's "x" rejoins
    backend.abort_trigger(H, dispatch.seq, {**undo, "kind": dispatch.kind})
    claim = backend.fire(H, None, overlap=True, lease=600, now=at(95), collect_limit=10).claim
    assert claim is not None
    assert claim.payload == ["x", "w"] and claim.triggers == 2


def test_abort_after_a_retry_rejoined_the_flight_keeps_the_backoff(store):
    # As above, with a backoff: the due time put back from before the aborted trigger was
    # earlier than the retry's not_before, so the retry could run before its countdown.
    backend = get_backend()
    t0 = timezone.now()

    def trigger(value, at):
        return trig(backend, value, wait=1, overlap=True, now=t0 + timedelta(seconds=at))

    def at(seconds):
        return t0 + timedelta(seconds=seconds)

    trigger("x", 0)
    run = backend.fire(H, None, overlap=True, lease=600, now=at(1)).claim
    assert run is not None
    trigger("w", 1.1)  # a flight of its own (overlap), due at 2.1; its message goes missing
    _y, dispatch, undo = trigger("y", 90)  # w's message is overdue: y publishes, and fails
    assert dispatch is not None
    backend.finish(H, run.run_id, ok=False, retry_in=30, now=at(90.1))  # not before 120.1
    backend.abort_trigger(H, dispatch.seq, {**undo, "kind": dispatch.kind})
    decision = backend.fire(H, None, overlap=True, lease=600, now=at(95))
    assert decision.action is FireAction.REARM
    assert decision.dispatch.countdown == pytest.approx(25.1)
