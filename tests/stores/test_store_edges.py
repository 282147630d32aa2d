"""Edge sequences of the state machine, driven on each real store directly (no worker), with
the store clock given (``now=``): publishes that fail and are released, the pump's takes
(limits, re-takes with the same sequence, early entries, concurrent pumps), leases that end
exactly at an operation, lost and retried runs that rejoin a flight, collected items, and
messages of cancelled flights. Most are regressions the property test found."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_debounce import conf
from django_debounce.backends import get_backend
from django_debounce.backends.base import LiveRun
from django_debounce.keys import dumps, key_hash
from django_debounce.state import Finish, FireAction, FlightOptions
from tests.support.peek import peek_store, us
from tests.support.procs import take_from_processes, trigger_from_processes

pytestmark = pytest.mark.django_db(transaction=True)

H = "e" * 64
TASK = "testapp.store_edges"  # registered nowhere: no pump of a live worker takes its entries
T0 = timezone.now()


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def opts(*, wait: float = 0.3, lease: float = 60.0, **options: Any) -> FlightOptions:
    return FlightOptions(wait=wait, lease=lease, **options)


def trig(backend, payload, t, *, key_hash=H, **options):
    """One trigger of ``key_hash`` at ``t`` (a collected item with ``collect_limit``, else
    the task's arguments); returns ``(result, dispatch)``."""
    o = opts(**options)
    return backend.trigger(
        task_name=TASK,
        key=f"edge:{key_hash[:8]}",
        key_hash=key_hash,
        payload_json=dumps(payload if o.collect else [payload]),
        options=o,
        now=at(t),
    )


def fire(backend, t, seq=None, *, key_hash=H, **options):
    return backend.fire(key_hash, seq, task_name=TASK, options=opts(**options), now=at(t))


def finish(backend, run_id, t, end=None, **options):
    return backend.finish(
        H, run_id, end or Finish(ok=True), task_name=TASK, options=opts(**options), now=at(t)
    )


def take(backend, t, limit=100, **options):
    return backend.take({TASK: opts(**options)}, limit, now=at(t))


def view(store, key_hash=H, collect=False):
    """The key's stored state (``tests/support/peek.py``, as the property test reads it; on
    the Redis store with what the key's counter counted folded in)."""
    return peek_store(get_backend(), key_hash, collect)


def hashed(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


# == publishes that fail: the flight waits in the index, the next take publishes it (I8) ====


def test_a_released_flight_keeps_its_triggers_and_the_next_take_publishes_it(store):
    backend = get_backend()
    _a, dispatch = trig(backend, "a", 0)
    merged, none = trig(backend, "b", 0.1)
    assert dispatch is not None and dispatch.countdown == pytest.approx(0.3)
    assert none is None and not merged.scheduled  # b merged: "a message is out"
    backend.release([dispatch], now=at(0.15))  # the broker refused a's message
    state = view(store)
    assert (state["pending"], state["triggers"], state["taken"]) == (2, 2, False)
    assert state["entry"] == state["due"] == us(at(0.4))  # back in the index at its due time
    assert take(backend, 0.4 - 1e-6).dispatches == []
    (message,) = take(backend, 0.4).dispatches
    assert (message.key_hash, message.task_name) == (H, TASK)
    assert message.seq != dispatch.seq  # a new message
    assert fire(backend, 0.4, dispatch.seq).action is FireAction.DROP  # the refused one
    claim = fire(backend, 0.4, message.seq).claim
    assert claim is not None and (claim.payload, claim.triggers) == (["b"], 2)


def test_the_only_trigger_of_a_released_flight_is_not_taken_back(store):
    # A refused publish takes nothing back (release replaced abort_trigger): the trigger is
    # counted and its flight runs once the broker is back.
    backend = get_backend()
    _a, dispatch = trig(backend, "a", 0, wait=0)
    assert dispatch is not None and dispatch.countdown == 0
    backend.release([dispatch], now=at(0))
    live = backend.live_state(H)
    assert (live["pending"], live["triggers"], live["flight_id"]) == (1, 1, 1)
    assert view(store)["entry"] == us(at(0))
    (message,) = take(backend, 0.01, wait=0).dispatches
    assert fire(backend, 0.02, message.seq, wait=0).claim.triggers == 1


def test_a_late_release_of_a_message_that_claimed_changes_nothing(store):
    # The broker may refuse a message the store already moved past (claimed by an earlier
    # delivery of it, or replaced): the release is for that message only.
    backend = get_backend()
    _a, dispatch = trig(backend, "a", 0, wait=0)
    claim = fire(backend, 0, dispatch.seq, wait=0).claim
    assert claim is not None
    trig(backend, "b", 0.1)  # during the run: its finish schedules the flight
    before = view(store)
    backend.release([dispatch], now=at(0.2))
    assert view(store) == before


def test_a_release_after_a_retry_rejoined_the_flight_keeps_the_run_items(store):
    # Port of an abort_trigger regression (the database store lost the run's items): a run's
    # retry lands between a trigger and the release of its refused publish; the run's items
    # rejoin the flight, first, and the release only untakes the message.
    backend = get_backend()
    items = {"wait": 1, "overlap": True, "collect_limit": 10, "lease": 600}
    _x, first = trig(backend, "x", 0, **items)
    run = fire(backend, 1, first.seq, **items).claim
    assert run is not None and run.payload == ["x"]
    _w, dispatch = trig(backend, "w", 1.1, **items)  # a flight of its own (overlap)
    assert dispatch is not None and dispatch.countdown == pytest.approx(1.0)
    follow = finish(backend, run.run_id, 1.5, Finish(ok=False, error="E", retry_in=0), **items)
    assert follow is None  # w's message is out for 2.1
    backend.release([dispatch], now=at(1.6))  # ... and it was refused
    state = view(store, collect=True)
    assert (state["payload"], state["attempt"], state["entry"]) == (["x", "w"], 1, us(at(2.1)))
    (message,) = take(backend, 2.1, **items).dispatches
    claim = fire(backend, 2.1, message.seq, **items).claim
    assert claim is not None
    assert (claim.payload, claim.triggers, claim.attempt) == (["x", "w"], 2, 1)


def test_a_release_after_a_retry_rejoined_the_flight_keeps_the_backoff(store):
    # As above, with a backoff: the released flight goes back to the index at its due time,
    # which the retry moved to its backoff's end (the retry does not run before it).
    backend = get_backend()
    o = {"wait": 1, "overlap": True, "lease": 600}
    _x, first = trig(backend, "x", 0, **o)
    run = fire(backend, 1, first.seq, **o).claim
    _w, dispatch = trig(backend, "w", 1.1, **o)  # due at 2.1, out at once
    finish(backend, run.run_id, 1.5, Finish(ok=False, error="E", retry_in=30), **o)
    backend.release([dispatch], now=at(1.6))
    state = view(store)
    assert state["not_before"] == state["due"] == state["entry"] == us(at(31.5))
    assert take(backend, 2.1, **o).dispatches == []
    decision = fire(backend, 25, **o)  # an in-process claim: not before the backoff (I3)
    assert decision.action is FireAction.REARM and decision.dispatch is None
    (message,) = take(backend, 31.5, **o).dispatches
    claim = fire(backend, 31.5, message.seq, **o).claim
    assert (claim.payload, claim.triggers, claim.attempt) == (["w"], 2, 1)


# == the pump's take ========================================================================


def test_take_with_a_limit_takes_the_earliest_entries_and_leaves_the_rest(store):
    backend = get_backend()
    keys = [hashed(i) for i in range(5)]
    for i, key in reversed(list(enumerate(keys))):  # made latest first, due earliest first
        trig(backend, "a", 0.1 * (5 - i), key_hash=key, wait=2 + 0.1 * (2 * i - 5))
    dues = [view(store, key)["entry"] for key in keys]
    assert dues == sorted(dues) and len(set(dues)) == 5
    first = take(backend, 10, limit=2)  # (a take's messages come in key-hash order)
    assert sorted(d.key_hash for d in first.dispatches) == sorted(keys[:2])
    assert first.next_in is not None and first.next_in <= 0  # more is due
    assert [view(store, key)["entry"] for key in keys[2:]] == dues[2:]  # untouched
    second = take(backend, 10, limit=2)
    assert sorted(d.key_hash for d in second.dispatches) == sorted(keys[2:4])
    last = take(backend, 10, limit=2)
    assert [d.key_hash for d in last.dispatches] == keys[4:]
    grace = conf.seconds_of("DISPATCH_GRACE")
    assert last.next_in == pytest.approx(grace)  # the taken messages' deadline
    assert take(backend, 10, limit=2).dispatches == []


def test_take_with_a_limit_in_several_rounds_takes_each_entry_once(store):
    backend = get_backend()
    keys = [hashed(i) for i in range(20)]
    for i, key in enumerate(keys):
        trig(backend, "a", 0.01 * i, key_hash=key, wait=2)
    taken = []
    for _ in range(10):
        got = take(backend, 5, limit=3).dispatches
        assert len(got) <= 3
        taken += [d.key_hash for d in got]
    assert sorted(taken) == sorted(keys)


def test_an_early_entry_is_moved_later_by_take_without_a_message(store):
    backend = get_backend()
    _a, none = trig(backend, "a", 0, wait=2)
    assert none is None  # due in 2 s: beyond the pump interval, it waits in the index
    merged, none = trig(backend, "b", 1.5, wait=2)  # a plain merge: the entry stays
    assert none is None and merged.due_at == at(3.5)
    assert view(store)["entry"] == us(at(2))
    early = take(backend, 2, wait=2)
    assert early.dispatches == [] and early.next_in == pytest.approx(1.5)
    state = view(store)
    assert (state["entry"], state["taken"], state["seq"]) == (us(at(3.5)), False, 0)
    (message,) = take(backend, 3.5, wait=2).dispatches
    assert fire(backend, 3.5, message.seq, wait=2).claim.payload == ["b"]


def test_a_message_taken_again_keeps_its_sequence_and_the_duplicate_is_dropped(store):
    # A message not claimed within DEBOUNCE_DISPATCH_GRACE (lost by the broker, or slow) is
    # taken again with the same sequence: whichever copy arrives first claims, the other is
    # dropped (I5).
    backend = get_backend()
    grace = conf.seconds_of("DISPATCH_GRACE")
    trig(backend, "a", 0, wait=2)
    (message,) = take(backend, 2, wait=2).dispatches  # ... and the broker loses it
    state = view(store)
    assert (state["taken"], state["entry"]) == (True, us(at(2 + grace)))
    trig(backend, "b", 3, wait=2)  # merges: the flight's message is out
    assert take(backend, 2 + grace - 1e-6, wait=2).dispatches == []
    again = take(backend, 2 + grace, wait=2)
    assert again.again == 1 and [(d.key_hash, d.seq) for d in again.dispatches] == [
        (H, message.seq)
    ]
    claim = fire(backend, 2 + grace, message.seq, wait=2).claim
    assert claim is not None and (claim.payload, claim.triggers) == (["b"], 2)
    assert fire(backend, 2 + grace + 0.1, message.seq, wait=2).action is FireAction.DROP
    assert backend.live_state(H)["runs"] == 1


def test_pumps_in_several_processes_never_take_one_entry_twice(store):
    backend = get_backend()
    keys = [hashed(i) for i in range(1200)]
    options = opts(wait=2)
    results = backend.trigger_many(
        task_name=TASK,
        items=[(f"edge:{k[:8]}", k, dumps(["a"])) for k in keys],
        options=options,
        now=at(0),
    )
    assert all(dispatch is None for _result, dispatch in results)  # due in 2 s: the index
    per_process = take_from_processes(
        {TASK: asdict(options)}, processes=4, limit=5, now_us=us(at(3))
    )
    taken = [item for took, errors in per_process for item in took]
    assert [errors for _took, errors in per_process] == [[], [], [], []]
    assert len(taken) == len(set(taken)) == len(keys)  # each key once, by one pump
    assert {key for key, _seq in taken} == set(keys)
    assert take(backend, 3).dispatches == []
    for key, seq in taken[:5]:
        assert view(store, key)["seq"] == seq  # the message each pump published claims
        assert fire(backend, 3, seq, key_hash=key, wait=2).action is FireAction.CLAIM


# == leases: an operation at exactly the lease end finds the run lost =======================


@pytest.fixture
def live_run(store):
    """A run of ``H`` claimed by a message at 1 with a lease of 1 s (it ends at 2)."""
    backend = get_backend()
    _a, dispatch = trig(backend, "a", 0, wait=0)
    claim = fire(backend, 1, dispatch.seq, wait=0, lease=1).claim
    assert claim is not None and view(store)["entry"] == us(at(2))
    return claim, dispatch.seq


@pytest.mark.parametrize("delta", [0, -1e-6], ids=["at-the-end", "just-before"])
@pytest.mark.parametrize("op", ["heartbeat", "extend", "take", "trigger", "finish", "fire"])
def test_an_operation_at_the_lease_end_finds_the_run_lost(store, live_run, op, delta):
    # Found by the property test: at now == running_until every operation counts the lease
    # as run out (the run is lost), 1 us before it is live; heartbeat and extend extended it
    # at the end, and the database store's recovery skipped it.
    backend = get_backend()
    claim, seq = live_run
    t = 2 + delta
    lost = delta == 0
    o = {"wait": 0, "lease": 1}
    if op == "heartbeat":
        got = backend.heartbeat(H, claim.run_id, 1, task_name=TASK, options=opts(**o), now=at(t))
        assert got is not lost
    elif op == "extend":
        (got,) = backend.extend([LiveRun(H, seq, 1, TASK, opts(**o))], now=at(t))
        assert got == (None if lost else pytest.approx(1.0))
    elif op == "take":
        got = take(backend, t, **o).dispatches
        assert [(d.key_hash, d.countdown) for d in got] == ([(H, 0)] if lost else [])
    elif op == "trigger":
        result, _dispatch = trig(backend, "b", t, **o)
        assert result.pending == (2 if lost else 1)  # the lost run's trigger rejoined
    elif op == "finish":
        follow = finish(backend, claim.run_id, t, **o)
        assert (follow is not None) is lost  # the lost run's flight, out at once
    else:
        decision = fire(backend, t, **o)  # an in-process claim
        assert decision.action is (FireAction.CLAIM if lost else FireAction.DROP)
    live = backend.live_state(H)
    if not lost:
        assert live["runs"] == 1
        assert live["state"] == ("idle" if op == "finish" else "running")
    elif op in ("heartbeat", "extend"):
        # neither recovers a lease: the run is lost for the next step that looks (the pump)
        assert view(store)["running_until"] == us(at(2))
        assert [d.key_hash for d in take(backend, t, **o).dispatches] == [H]
    else:
        assert (live["state"], live["runs"]) == (("running", 1) if op == "fire" else ("pending", 0))
        assert view(store)["run_id"] == (2 if op == "fire" else 1)


def test_extend_of_a_run_that_is_not_live_returns_none(store, live_run):
    backend = get_backend()
    claim, seq = live_run
    o = opts(wait=0, lease=1)
    other = hashed(1)
    _b, dispatch = trig(backend, "b", 1, key_hash=other, wait=0)
    fire(backend, 1, dispatch.seq, key_hash=other, wait=0, lease=1)
    runs = [LiveRun(H, seq, 1, TASK, o), LiveRun(other, dispatch.seq, 1, TASK, o)]
    assert backend.extend(runs, now=at(1.5)) == [pytest.approx(1.0), pytest.approx(1.0)]
    assert view(store)["entry"] == us(at(2.5))  # the index follows the lease
    assert backend.extend([LiveRun(H, seq + 1, 1, TASK, o)], now=at(1.6)) == [None]  # not its
    finish(backend, claim.run_id, 1.7, wait=0, lease=1)
    assert backend.extend(runs, now=at(1.8)) == [None, pytest.approx(1.0)]  # finished
    assert backend.extend([LiveRun(hashed(2), 1, 1, TASK, o)], now=at(1.8)) == [None]  # unknown
    # a run claimed in-process (run_due) has no message: the keeper never extends it
    trig(backend, "c", 2, wait=0)
    assert fire(backend, 2, wait=0, lease=1).claim is not None
    assert backend.extend([LiveRun(H, 0, 1, TASK, o)], now=at(2.1)) == [None]


def test_a_finish_after_the_lease_keeps_the_run_lost(store):
    # Found by the property test (database store): a finish that found the run's lease run
    # out recovered the lease (its triggers back to pending) and then returned without
    # saving the row, so the key stayed "running" on an expired lease.
    backend = get_backend()
    trig(backend, "a", 0, wait=0)
    claim = fire(backend, 1, wait=0, lease=1).claim
    assert claim is not None
    follow = finish(backend, claim.run_id, 3, wait=0, lease=1)
    assert follow is not None and follow.countdown == 0  # the recovered flight's message
    live = backend.live_state(H)
    assert (live["state"], live["pending"], live["runs"]) == ("pending", 1, 0)
    assert view(store)["entry"] == us(at(3)) + round(conf.seconds_of("DISPATCH_GRACE") * 1e6)


def test_a_lost_run_is_found_by_the_pump_at_its_lease_end(store):
    # Port of a lease-watchdog regression: a retry, then a run whose worker dies. No watchdog
    # message now: the live run's lease end is its key's index entry, and the pump redoes
    # the run (I7), with the triggers that came during it.
    backend = get_backend()
    o = {"wait": 0, "lease": 60}
    _a, first = trig(backend, "a", 0, **o)
    run = fire(backend, 0, first.seq, **o).claim
    trig(backend, "b", 0.1, **o)  # during the run: its finish schedules the flight
    follow = finish(backend, run.run_id, 0.2, Finish(ok=False, error="E", retry_in=0), **o)
    assert follow is not None
    second = fire(backend, 0.2, follow.seq, **o).claim
    assert second is not None and second.triggers == 2
    _c, none = trig(backend, "c", 0.3, **o)
    assert none is None  # the live run's finish would schedule it
    assert view(store)["entry"] == us(at(60.2))  # ... but its worker dies
    assert take(backend, 60.2 - 1e-6, **o).dispatches == []
    (message,) = take(backend, 60.2, **o).dispatches
    redo = fire(backend, 60.3, message.seq, **o).claim
    assert redo is not None and (redo.triggers, redo.payload, redo.attempt) == (3, ["c"], 2)


# == quiet periods kept when claimed triggers rejoin a flight (I3) ==========================


def test_lease_lost_just_after_a_trigger_keeps_that_trigger_quiet_period(store):
    backend = get_backend()
    trig(backend, "a", 0, wait=0)
    assert fire(backend, 0, wait=0, lease=0.5).claim is not None
    trig(backend, "b", 0.35, wait=1)  # due at 1.35, after the lease ends
    assert take(backend, 0.6, wait=1).dispatches == []  # the run is lost: "a" rejoins
    state = view(store)
    assert (state["pending"], state["running_until"]) == (2, None)
    assert state["due"] == state["entry"] == us(at(1.35))
    decision = fire(backend, 0.6, wait=1)
    assert decision.action is FireAction.REARM  # not claimed before b's due time (I3)
    assert decision.dispatch.countdown == pytest.approx(0.75)


def test_a_lost_run_rejoining_a_flight_keeps_its_max_wait_bound(store):
    # A lost run's triggers rejoin the open flight with their older first trigger time, and
    # the flight is due by their max_wait bound; the due time is the one the last trigger
    # gave it (I3 holds a claim to that, as lodash restarts its timer at each call).
    backend = get_backend()
    o = {"wait": 2, "max_wait": 3.5, "overlap": True, "lease": 1}
    trig(backend, "a", 0, **o)
    claim = fire(backend, 2, **o).claim
    assert claim is not None  # run 1, lease until 3; its worker dies
    b, _d = trig(backend, "b", 2.5, **o)  # a new flight during the run (overlap), due 4.5
    assert b.due_at == at(4.5)
    c, _d = trig(backend, "c", 3.5, **o)  # run 1 is lost first: "a" rejoins, with its time
    assert (c.pending, c.due_at) == (3, at(3.5))  # a's bound: 0 + max_wait
    again = fire(backend, 3.6, **o)
    assert again.action is FireAction.CLAIM
    assert (again.claim.triggers, again.claim.payload) == (3, ["c"])


def test_a_retried_run_rejoining_a_flight_does_not_cut_a_newer_trigger_quiet_period(store):
    backend = get_backend()
    o = {"wait": 2}
    trig(backend, "a", 0, **o)
    run = fire(backend, 2, **o).claim
    b, none = trig(backend, "b", 2.5, **o)  # due at 4.5; the live run's finish schedules it
    assert none is None and b.due_at == at(4.5)
    follow = finish(backend, run.run_id, 3, Finish(ok=False, error="E", retry_in=0), **o)
    assert follow is None  # due in 1.5 s: in the index (not at once, with the retry)
    state = view(store)
    assert (state["pending"], state["due"], state["entry"]) == (2, us(at(4.5)), us(at(4.5)))
    assert fire(backend, 3.5, **o).action is FireAction.REARM


# == collected items ========================================================================


def test_collected_items_keep_trigger_order(store):
    # Found by the property test (Redis): items were scored by a counter a refused publish
    # took back, so an item could tie with an earlier one and Redis ordered ties by text
    # ("1" before "10"). Items come in trigger order: after a release, and when a lost run's
    # items rejoin the flight (first, before the items that came during the run).
    backend = get_backend()
    o = {"wait": 1, "collect_limit": 10, "lease": 1}
    _a, dispatch = trig(backend, "a", 0, **o)
    trig(backend, 2, 0.1, **o)
    backend.release([dispatch], now=at(0.15))
    trig(backend, 10, 0.2, **o)
    trig(backend, 2, 0.3, **o)  # already in the flight
    trig(backend, 1, 0.4, **o)
    claim = fire(backend, 2, **o).claim
    assert claim.payload == ["a", 2, 10, 1] and claim.triggers == 5
    trig(backend, 3, 2.1, **o)  # during the run; its worker dies
    trig(backend, "b", 2.2, **o)
    trig(backend, 0, 3, **o)  # at the lease end: the run is lost, its items come first
    assert view(store, collect=True)["payload"] == ["a", 2, 10, 1, 3, "b", 0]
    redo = fire(backend, 4, **o).claim
    assert redo.payload == ["a", 2, 10, 1, 3, "b", 0] and redo.triggers == 8


def test_a_collected_flight_that_fills_up_goes_out_before_its_message(store):
    # Found by the property test: a trigger that made the flight due before the message out
    # (here: the batch filled up) merged without a message for the earlier time. A full batch
    # goes out at once; the message for the later time is dropped when it arrives.
    backend = get_backend()
    o = {"wait": 0.5, "collect_limit": 3}
    _1, later = trig(backend, 1, 0, **o)
    assert later is not None and later.countdown == pytest.approx(0.5)
    _2, none = trig(backend, 2, 0.1, **o)
    assert none is None
    full, now = trig(backend, 3, 0.2, **o)
    assert now is not None and now.countdown == 0 and full.scheduled
    assert fire(backend, 0.2, now.seq, **o).claim.payload == [1, 2, 3]
    assert fire(backend, 0.5, later.seq, **o).action is FireAction.DROP


# == cancelled flights ======================================================================


def test_a_message_of_a_cancelled_flight_is_dropped(store):
    backend = get_backend()
    _a, dispatch = trig(backend, "a", 0)
    assert backend.cancel(H, task_name=TASK, options=opts(), now=at(0.1)) == 1
    assert view(store)["entry"] is None
    assert fire(backend, 0.3, dispatch.seq).action is FireAction.DROP
    _b, again = trig(backend, "b", 0.4)  # a new flight, a new message
    assert again is not None and again.seq != dispatch.seq
    assert fire(backend, 0.7, dispatch.seq).action is FireAction.DROP  # still stale
    claim = fire(backend, 0.7, again.seq).claim
    assert claim is not None and (claim.payload, claim.triggers) == (["b"], 1)
    live = backend.live_state(H)
    assert (live["triggers"], live["cancelled"], live["runs"]) == (2, 1, 1)


def test_a_cancelled_flight_leaves_the_index(store):
    backend = get_backend()
    trig(backend, "a", 0, wait=5)
    assert view(store)["entry"] == us(at(5))
    assert backend.cancel(H, task_name=TASK, options=opts(wait=5), now=at(1)) == 1
    assert view(store)["entry"] is None
    assert take(backend, 6, wait=5).dispatches == []
    assert backend.live_state(H)["pending"] == 0


@pytest.mark.parametrize(
    "options",
    [{}, {"leading": True}, {"leading": True, "trailing": False}, {"max_wait": 0.5},
     {"collect_limit": 3}],
    ids=["trailing", "leading", "leading-only", "max_wait", "collect"],
)  # fmt: skip
def test_trigger_many_is_the_same_triggers_one_by_one(store, options):
    """A ``trigger_many`` batch (repeated keys, keys with no row, an open flight, a live run,
    an idle key after a run, and on Redis an open flight whose counter was lost) leaves every key
    as the same triggers made one by one at the same time, and returns the same results and
    dispatches: two copies of the same keys, one fed the batch, the other ``trigger`` after
    ``trigger``."""
    backend = get_backend()
    o = opts(**options)

    def key_of(copy: int, i: int) -> str:
        return hashed(1000 * copy + i)

    def payload(n: int) -> str:
        return dumps({"n": n} if o.collect else [n])

    for copy in (1, 2):  # the same history for both copies
        trig(backend, 1, 0.0, key_hash=key_of(copy, 1), **options)  # open flight
        trig(backend, 2, 0.0, key_hash=key_of(copy, 2), **options)  # live run at 1.0
        trig(backend, 3, 0.0, key_hash=key_of(copy, 3), **options)  # idle after a run
        for i in (2, 3):
            d = fire(backend, 0.4, key_hash=key_of(copy, i), **options)
            assert d.action is FireAction.CLAIM, d
        backend.finish(
            key_of(copy, 3), d.claim.run_id, Finish(ok=True), task_name=TASK, options=o,
            now=at(0.5),
        )  # fmt: skip
        trig(backend, 5, 0.0, key_hash=key_of(copy, 5), **options)  # open flight
        if store == "redis":  # ... whose counter is lost: the row holds the flight
            backend.client.delete(backend.counter_key(key_of(copy, 5)))
    order = [0, 1, 0, 2, 5, 3, 1, 4, 0, 3, 5]  # 0 and 4: no row yet
    items = [(f"edge:{i}", key_of(1, i), payload(n)) for n, i in enumerate(order)]
    many = backend.trigger_many(task_name=TASK, items=items, options=o, now=at(1.0))
    one_by_one = [
        backend.trigger(
            task_name=TASK, key=f"edge:{i}", key_hash=key_of(2, i), payload_json=payload(n),
            options=o, now=at(1.0),
        )
        for n, i in enumerate(order)
    ]  # fmt: skip

    def seen(pair: Any) -> tuple:
        result, dispatch = pair
        shown = asdict(result) | {"key": None}  # each copy's row has a key text of its own
        if store == "redis":
            # a trigger its counter absorbed is told no due time; the batch sends a key whose
            # triggers differ in payload to the row path (the states below are the same)
            shown["due_at"] = None
        sent = None if dispatch is None else (dispatch.seq, dispatch.countdown)
        return shown, sent

    assert [seen(p) for p in many] == [seen(p) for p in one_by_one]
    for i in sorted(set(order)):
        assert view(store, key_of(1, i), o.collect) == view(store, key_of(2, i), o.collect), i


def test_trigger_many_from_several_processes_counts_every_trigger_once(store):
    """Four processes each send five ``trigger_many`` batches of the same 300 keys (150 new
    per process first), in orders of their own: no batch waits on another for ever (the
    database store locks rows in key-hash order), and each key counts every trigger once
    (I6), in one flight."""
    import random

    from tests.testapp.tasks import record_slow  # wait 60 s: nothing comes due meanwhile

    tags = [f"many-{j}" for j in range(300)]
    per_process = []
    for p in range(4):
        order = tags[:]
        random.Random(p).shuffle(order)
        per_process.append([[[t] for t in order] for _ in range(5)])
    errors = trigger_from_processes("record_slow", per_process, many=True)
    assert errors == []
    backend = get_backend()
    for tag in tags:
        key = record_slow.resolve((tag,), {})[0]
        live = backend.live_state(key_hash(record_slow.name, key))
        assert (live["pending"], live["triggers"], live["flight_id"]) == (20, 20, 1), tag


@contextmanager
def planted(key_hash: str = H) -> Iterator[None]:
    """A PostgreSQL trigger that fails every ``UPDATE`` of ``key_hash``'s key row: a real
    database error in the middle of a step (only on PostgreSQL)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("a planted trigger function is PostgreSQL's")
    table = "django_debounce_debouncekey"
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION debounce_planted() RETURNS trigger AS "
            "$$ BEGIN RAISE EXCEPTION 'planted failure'; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            f"CREATE TRIGGER debounce_planted BEFORE UPDATE ON {table} FOR EACH ROW "
            f"WHEN (NEW.key_hash = '{key_hash}') EXECUTE FUNCTION debounce_planted()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER debounce_planted ON {table}")
            cursor.execute("DROP FUNCTION debounce_planted()")


@pytest.fixture
def planted_failure() -> Iterator[None]:
    with planted():
        yield


def _idle() -> bool:
    """Django's connection is in autocommit with no transaction open on the server."""
    from django.db import connection

    status = connection.connection.info.transaction_status.name
    return status == "IDLE" and connection.get_autocommit() and not connection.in_atomic_block


def test_a_step_whose_writes_fail_leaves_no_transaction_open(store, planted_failure):
    """A step's writes go out with its ``COMMIT`` (PostgreSQL): when they fail there, the step
    rolls back, the connection is idle and takes the next step; the key keeps what its last
    committed step wrote."""
    from django.db import DatabaseError

    backend = get_backend()
    trig(backend, 1, 0)  # opens: the row is made (an INSERT; the planted trigger is on UPDATE)
    with pytest.raises(DatabaseError, match="planted failure"):
        fire(backend, 1)  # the claim: its UPDATE of the row goes out with COMMIT, and fails
    assert _idle()
    assert peek_store(backend, H)["pending"] == 1
    result, _dispatch = trig(backend, 1, 1, key_hash="f" * 64)  # another key: counted
    assert result.pending == 1 and _idle()


def test_a_step_whose_read_fails_leaves_no_transaction_open(store):
    """``BEGIN`` goes out with the step's locking read: when the read fails (its lock waits
    past ``lock_timeout`` on a row another session holds), the step rolls back, the
    connection is idle, and the same step succeeds once the row is free."""
    import psycopg
    from django.db import DatabaseError, connection

    if connection.vendor != "postgresql":
        pytest.skip("lock_timeout is PostgreSQL's")
    backend = get_backend()
    trig(backend, 1, 0)
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    lock = "SELECT 1 FROM django_debounce_debouncekey WHERE key_hash = %s FOR UPDATE"
    with psycopg.connect(**params, autocommit=False) as other:
        other.execute(lock, [H])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '100ms'")
        try:
            with pytest.raises(DatabaseError, match="lock timeout"):
                fire(backend, 1)
            assert _idle()
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 0")
    assert fire(backend, 1).action == FireAction.CLAIM


def test_a_claim_that_fails_after_its_seal_keeps_what_the_counter_counted(store):
    """A claim seals the key's counter (on the Redis store: the merged triggers leave Redis)
    and then fails to commit: the row still names the counter, and the next claim reads the
    same count from the counter's tombstone. No trigger is lost to the failed claim."""
    from django.db import DatabaseError

    from django_debounce.models import DebounceRun

    backend = get_backend()
    for i in range(3):  # an opening and, on the Redis store, two merges into its counter
        trig(backend, 1, 0.1 * i)
    with planted(), pytest.raises(DatabaseError, match="planted failure"):
        fire(backend, 1)
    if backend.name == "redis":  # the kept count waits for the pump's retake of the flight
        grace_ms = conf.seconds_of("DISPATCH_GRACE") * 1000
        assert backend.client.pttl(backend.counter_key(H)) >= grace_ms
    # the retry comes after the counter's own fence (counter_until) has passed
    late = 1 + conf.seconds_of("DISPATCH_GRACE")
    assert fire(backend, late).action == FireAction.CLAIM
    assert DebounceRun.objects.get(flight_id=1).triggers == 3


@pytest.fixture
def server_side_binding() -> Iterator[None]:
    """Django's connection with psycopg's server-side binding cursor: one statement per
    ``execute`` (the steps keep ``atomic()``)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("server_side_binding is PostgreSQL's")
    options = connection.settings_dict["OPTIONS"]
    connection.close()
    options["server_side_binding"] = True
    try:
        yield
    finally:
        connection.close()
        del options["server_side_binding"]


def test_steps_of_one_key_on_a_server_side_binding_cursor(store, server_side_binding):
    """A trigger, a merge, a claim and a finish on the database's clock (no ``now``), with
    each statement sent alone: the run covers both triggers and the key is idle after."""
    from django_debounce.models import DebounceKey, DebounceRun

    backend = get_backend()
    o = opts(wait=0.0)
    for _ in range(2):
        result, _dispatch = backend.trigger(
            task_name=TASK, key="edge:ssb", key_hash=H, payload_json=dumps([1]), options=o
        )
    decision = backend.fire(H, None, task_name=TASK, options=o)
    assert decision.action == FireAction.CLAIM and decision.claim is not None
    backend.finish(H, decision.claim.run_id, Finish(ok=True), task_name=TASK, options=o)
    run = DebounceRun.objects.get(flight_id=1)
    assert (run.triggers, run.outcome) == (2, "success")
    assert DebounceKey.objects.get(key_hash=H).state == "idle"


# == a batch's new rows: one statement, and the columns' own limits ==========================


def test_a_batch_of_new_rows_refuses_a_value_its_column_cannot_hold(store):
    """The rows ``trigger_many`` makes go out in one ``INSERT ... SELECT FROM VALUES``; a task
    name longer than its column raises there as a plain ``INSERT`` would, and is never
    written cut (a cut name's flight would be stranded: the pump takes entries by name)."""
    from django.db import DataError

    from django_debounce.models import DebounceDue, DebounceKey

    backend = get_backend()
    long_name = "testapp." + "x" * 300
    items = [(f"edge:{i}", hashed(i), dumps([i])) for i in range(3)]
    if backend.rows().pg:
        with pytest.raises(DataError):
            backend.trigger_many(task_name=long_name, items=items, options=opts())
        assert not DebounceKey.objects.exists() and not DebounceDue.objects.exists()
    got = backend.trigger_many(task_name=TASK, items=items, options=opts())
    assert [r.pending for r, _ in got] == [1, 1, 1]
    assert set(DebounceKey.objects.values_list("key_hash", flat=True)) == {h for _, h, _ in items}
    assert DebounceDue.objects.filter(task_name=TASK).count() == 3


# == times: exact whatever USE_TZ and the zone ===============================================


@pytest.mark.parametrize("use_tz", [True, False], ids=["USE_TZ", "no-USE_TZ"])
def test_a_record_reads_its_times_exactly_whatever_use_tz(store, use_tz):
    """A record's times are read as the instants they are under either ``USE_TZ``; on
    PostgreSQL also in the hour New York lives twice (1 November 2026, 01:00-02:00), where a
    naive local time is ambiguous. (SQLite keeps Django's text, naive local time under
    ``USE_TZ = False``: its file cannot tell that hour apart, so there the times are the
    trigger's own.)"""
    from datetime import UTC, datetime

    from django.db import connection
    from django.test import override_settings

    from django_debounce.backends.rows import to_us
    from django_debounce.models import DebounceKey

    first = last = at(0)
    with override_settings(USE_TZ=use_tz, TIME_ZONE="America/New_York"):
        backend = get_backend()
        trig(backend, "tz", 0)
        if backend.rows().pg:
            first = datetime(2026, 11, 1, 5, 30, 0, 123456, tzinfo=UTC)  # 01:30 EDT
            last = datetime(2026, 11, 1, 6, 30, 0, 654321, tzinfo=UTC)  # 01:30 EST, again
            with connection.cursor() as cursor:
                cursor.execute(
                    f'UPDATE "{DebounceKey._meta.db_table}" SET "first_trigger_at" = '
                    '%s::timestamptz, "last_trigger_at" = %s::timestamptz WHERE "key_hash" = %s',
                    [first.isoformat(), last.isoformat(), H],
                )
        record = backend.rows().read(H, None)
    assert record is not None
    assert (record.key.first, record.key.last) == (to_us(first), to_us(last))
