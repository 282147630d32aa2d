"""``task.flush()`` as lodash's ``flush()`` (issue 23 item 2): the flushed flight runs now with
the triggers it held; a trigger after the flush belongs to the next flight and runs after its
own wait. No worker: eager mode, and the store driven directly for the flush's message."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from django_debounce import RunInfo, conf, debounced_task
from django_debounce.keys import dumps, key_hash
from django_debounce.models import DebounceRun
from django_debounce.state import Finish, FireAction
from django_debounce.testing import run_due

RUNS: list[tuple[str, int, int]] = []  # (note, triggers, flight id) of each run of `flushed`


@debounced_task(wait=5, name="tests.api.flushed", key=lambda tag, note="": tag)
def flushed(tag: str, note: str = "", *, debounce: RunInfo) -> None:
    RUNS.append((note, debounce.triggers, debounce.flight_id))


@pytest.fixture(autouse=True)
def no_runs_yet() -> None:
    RUNS.clear()


def trigger(tag: str, note: str, at):
    """A trigger of ``flushed`` at ``at``, on its store directly."""
    key, payload = flushed.resolve((tag,), {"note": note})
    result, _dispatch = flushed.get_backend().trigger(
        task_name=flushed.name,
        key=key,
        key_hash=key_hash(flushed.name, key),
        payload_json=dumps(payload),
        options=flushed.flight_options(),
        now=at,
    )
    return result


def step(what: str, tag: str, at, *args, **kwargs):
    """One store step of ``flushed``'s key ``tag`` at ``at``."""
    backend = flushed.get_backend()
    hashed = key_hash(flushed.name, flushed.resolve((tag,), {})[0])
    call = getattr(backend, what)
    return call(
        hashed, *args, task_name=flushed.name, options=flushed.flight_options(), now=at, **kwargs
    )


def payload_of(tag: str, note: str):
    """The payload a trigger of ``flushed`` with ``note`` stores."""
    return json.loads(dumps(flushed.resolve((tag,), {"note": note})[1]))


@pytest.mark.django_db(transaction=True)
def test_eager_flush_then_trigger_makes_two_runs(eager, store):
    flushed.trigger("e", note="one")
    flushed.trigger("e", note="two")
    assert flushed.flush("e") is True
    assert RUNS == [("two", 2, 1)]  # ran in the flush, with what the flight held
    flushed.trigger("e", note="three")  # the next flight: its own run, after its wait
    assert run_due() == 0
    assert run_due(now=timezone.now() + timedelta(seconds=4)) == 0
    assert run_due(now=timezone.now() + timedelta(seconds=6)) == 1
    assert RUNS == [("two", 2, 1), ("three", 1, 2)]
    assert flushed.status("e").pending == 0
    assert flushed.flush("e") is False


@pytest.mark.django_db(transaction=True)
def test_a_trigger_before_the_flushed_run_starts_is_not_merged_into_it(store):
    t0 = timezone.now()
    trigger("m", "one", t0)
    trigger("m", "two", t0 + timedelta(seconds=1))
    dispatch = step("flush", "m", t0 + timedelta(seconds=2))
    assert dispatch is not None and dispatch.countdown == 0
    # the flush claimed the flight: its run row is written, not started yet
    run = DebounceRun.objects.get()
    assert (run.run_id, run.flight_id, run.triggers, run.outcome) == (1, 1, 2, "running")
    later = trigger("m", "three", t0 + timedelta(seconds=3))
    assert (later.flight_id, later.pending) == (2, 1)  # the next flight, not the flushed one
    assert later.due_at == t0 + timedelta(seconds=8)
    # the flush's message starts the claimed run, with the flushed triggers only
    decision = step("fire", "m", t0 + timedelta(seconds=4), dispatch.seq)
    assert decision.action is FireAction.CLAIM
    claim = decision.claim
    assert (claim.run_id, claim.flight_id, claim.triggers) == (1, 1, 2)
    assert claim.payload == payload_of("m", "two")
    assert claim.started_at == t0 + timedelta(seconds=2)  # claimed by the flush
    assert DebounceRun.objects.count() == 1
    # a duplicate delivery finds it started
    again = step("fire", "m", t0 + timedelta(seconds=5), dispatch.seq)
    assert again.action is FireAction.DROP
    assert step("finish", "m", t0 + timedelta(seconds=6), 1, Finish(ok=True)) is None
    # the trigger after the flush runs after its own wait
    early = step("fire", "m", t0 + timedelta(seconds=7), None)
    assert early.action is not FireAction.CLAIM
    second = step("fire", "m", t0 + timedelta(seconds=8), None)
    assert second.action is FireAction.CLAIM
    assert (second.claim.run_id, second.claim.flight_id, second.claim.triggers) == (2, 2, 1)
    assert second.claim.payload == payload_of("m", "three")
    assert list(DebounceRun.objects.order_by("run_id").values_list("outcome", flat=True)) == [
        "success",
        "running",
    ]


@pytest.mark.django_db(transaction=True)
def test_a_flush_message_that_comes_too_late_is_dropped_and_its_triggers_run(store):
    grace = timedelta(seconds=conf.seconds_of("DISPATCH_GRACE"))
    t0 = timezone.now()
    trigger("l", "one", t0)
    dispatch = step("flush", "l", t0 + timedelta(seconds=1))
    assert dispatch is not None
    late = t0 + timedelta(seconds=1) + grace
    # the run was not started within the dispatch grace: its triggers are pending again
    decision = step("fire", "l", late, dispatch.seq)
    assert decision.action is FireAction.DROP
    assert flushed.get_backend().pending_counts([dispatch.key_hash]) == {dispatch.key_hash: 1}
    run = DebounceRun.objects.get()
    assert (run.outcome, run.error.startswith("not started")) == ("lost", True)
    # due at once (they were flushed), no attempt counted: the next claim runs them
    redo = step("fire", "l", late + timedelta(microseconds=1), None)
    assert redo.action is FireAction.CLAIM
    assert (redo.claim.run_id, redo.claim.triggers, redo.claim.attempt) == (2, 1, 0)
    assert redo.claim.payload == payload_of("l", "one")


@pytest.mark.django_db(transaction=True)
def test_a_refused_flush_message_puts_the_flight_back_for_the_pump(store):
    backend = flushed.get_backend()
    t0 = timezone.now()
    trigger("r", "one", t0)
    dispatch = step("flush", "r", t0 + timedelta(seconds=1))
    assert dispatch is not None
    backend.release([dispatch], now=t0 + timedelta(seconds=2))  # the broker refused it
    taken = backend.take(
        {flushed.name: flushed.flight_options()}, 10, now=t0 + timedelta(seconds=3)
    )
    (again,) = taken.dispatches
    assert again.seq > dispatch.seq
    assert step("fire", "r", t0 + timedelta(seconds=4), dispatch.seq).action is FireAction.DROP
    decision = step("fire", "r", t0 + timedelta(seconds=5), again.seq)
    assert decision.action is FireAction.CLAIM
    assert (decision.claim.run_id, decision.claim.triggers, decision.claim.attempt) == (2, 1, 0)
