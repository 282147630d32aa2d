"""Triggers that wait for one commit go out together (issue 23 item 1): one ``trigger_many``
per task at the commit, as Django runs ``on_commit`` callbacks (a savepoint that rolls back
drops its triggers; a failure does not stop the caller's later callbacks; a caller's callback
registered after a trigger sees it counted)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from django_debounce import trigger_many
from django_debounce.backends import get_backend
from tests.support.private_tasks import private_receiver, private_task
from tests.testapp.models import OtherItem

pytestmark = pytest.mark.django_db(transaction=True)


class Undone(Exception):
    """Rolls an ``atomic()`` block back."""


@pytest.fixture
def store_calls(store: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Every call the store gets, ``("trigger", 1)`` or ``("trigger_many", items)``: the
    real methods, counted on their way through."""
    calls: list[tuple[str, int]] = []
    kind = type(get_backend())
    single, many = kind.trigger, kind.trigger_many

    def trigger(self: Any, **kwargs: Any) -> Any:
        calls.append(("trigger", 1))
        return single(self, **kwargs)

    def trigger_many_(self: Any, **kwargs: Any) -> Any:
        calls.append(("trigger_many", len(kwargs["items"])))
        return many(self, **kwargs)

    monkeypatch.setattr(kind, "trigger", trigger)
    monkeypatch.setattr(kind, "trigger_many", trigger_many_)
    yield calls


def test_the_triggers_of_one_commit_go_out_in_one_batch(store_calls):
    with private_task("commit_batch.one", wait=3600) as task:
        with transaction.atomic():
            for n in range(40):
                assert task.trigger(f"k{n}").deferred
            task.trigger("k0")
            trigger_many(task, ["k1", "k2"])
            assert store_calls == []
        assert store_calls == [("trigger_many", 43)]
        assert task.status("k0").pending == 2
        assert task.status("k1").pending == 2
        assert task.status("k39").pending == 1


def test_a_savepoint_that_rolls_back_drops_its_triggers(store_calls):
    with private_task("commit_batch.savepoint", wait=3600) as task:
        with transaction.atomic():
            with pytest.raises(Undone), transaction.atomic():
                task.trigger("gone-first")  # the transaction's first trigger
                raise Undone
            task.trigger("kept")
            with pytest.raises(Undone), transaction.atomic():
                task.trigger("gone")
                trigger_many(task, ["gone-many"])
                raise Undone
            with transaction.atomic():
                task.trigger("kept-inner")
        assert store_calls == [("trigger_many", 2)]
        assert task.status("kept").pending == 1
        assert task.status("kept-inner").pending == 1
        for key in ("gone-first", "gone", "gone-many"):
            assert task.status(key) is None


def test_a_transaction_rolled_back_sends_nothing_and_the_next_commit_sends_its_own(store_calls):
    with private_task("commit_batch.rollback", wait=3600) as task:
        with pytest.raises(Undone), transaction.atomic():
            task.trigger("gone")
            raise Undone
        with transaction.atomic():
            task.trigger("next")
        assert store_calls == [("trigger_many", 1)]
        assert task.status("gone") is None
        assert task.status("next").pending == 1


def test_a_callback_registered_after_a_trigger_sees_the_batch_counted(store):
    seen: list[Any] = []
    with private_task("commit_batch.seen", wait=3600) as task:
        with transaction.atomic():
            task.trigger("a")
            transaction.on_commit(lambda: seen.append((task.status("a"), task.status("b"))))
            task.trigger("b")
        a, b = seen[0]
        assert a.pending == 1 and b.pending == 1
        assert task.flush("a") is True  # flush in a callback finds the flight too
        with transaction.atomic():
            task.trigger("c")
            transaction.on_commit(lambda: seen.append(task.flush("c")))
        assert seen[1] is True


def test_a_failing_batch_does_not_stop_the_callers_later_callbacks(store, caplog):
    ran: list[str] = []
    with (
        private_task("commit_batch.good", wait=3600) as good,
        private_task("commit_batch.bad", wait=3600, backend="tests.nowhere.Backend") as bad,
        caplog.at_level(logging.ERROR),
    ):
        with transaction.atomic():
            bad.trigger("x")
            good.trigger("y")
            transaction.on_commit(lambda: ran.append("mine"))
        assert ran == ["mine"]
        assert good.status("y").pending == 1
        assert "commit_batch.bad" in caplog.text


def test_per_call_waits_keep_the_order_of_one_keys_triggers(store_calls):
    with private_task("commit_batch.waits", wait=3600) as task:
        with transaction.atomic():
            task.trigger("k")
            task.trigger("other")
            task.trigger("k", debounce_wait=7200)
            task.trigger("k")
        assert store_calls == [("trigger_many", 2), ("trigger_many", 1), ("trigger_many", 1)]
        assert task.status("k").pending == 3


def test_an_import_of_many_rows_sends_one_batch_per_commit(store_calls):
    with private_receiver("commit_batch.rows", OtherItem, wait=3600) as task:
        for _chunk in range(2):
            with transaction.atomic():
                rows = [OtherItem.objects.create(value=n) for n in range(30)]
        # OtherItem has the suite's own receiver too: one batch per task and commit
        assert store_calls == [("trigger_many", 30)] * 4
        assert all(task.status(row).pending == 1 for row in rows)
