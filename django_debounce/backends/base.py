"""The backend contract: the operations of the per-key state machine (docs/design.md,
"State machine").

Each store implements these names with identical semantics; the flow layer (``tasks.py``)
asks a store what to do and does it, it never re-decides.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django_debounce.state import Dispatch, FireDecision, TriggerResult


class BaseBackend:
    """Operations of docs/design.md, "State machine". Every method is atomic in its store.

    Times are the store's clock; ``now`` arguments exist for ``run_due`` and the property
    tests, and replace that clock for one call (``None``: the store's own clock).
    """

    name = "base"

    def trigger(
        self,
        *,
        task_name: str,
        key: str,
        key_hash: str,
        payload: Any,
        wait: float,
        max_wait: float | None,
        overlap: bool = False,
        payload_json: str | None = None,
        leading: bool = False,
        trailing: bool = True,
        collect_limit: int | None = None,
        now: datetime | None = None,
    ) -> tuple[TriggerResult, Dispatch | None, dict[str, Any] | None]:
        """Count one trigger (step 1).

        Edges as lodash debounce: with ``leading``, a trigger that opens a flight when the
        key's last trigger is ``wait`` or more ago (or its last run ``max_wait`` or more ago)
        makes a flight due at once; with ``trailing=False`` a trigger that would open any
        other flight is dropped (counted in ``cancelled``). The flight is due at
        ``min(last trigger + wait, anchor + max_wait)``: its anchor is the last run's claim
        when the trigger that opened it continued the stream (the case just named: lodash's
        ``lastInvokeTime``), else its first trigger. With ``collect_limit`` (collect
        mode) ``payload`` is one item; the flight keeps its distinct items in trigger order
        and is due at once when it holds ``collect_limit`` of them.

        Returns ``(result, dispatch, undo)``: ``dispatch`` is the message the caller must
        publish (``None`` when the trigger was merged), ``undo`` what ``abort_trigger``
        needs to take the trigger back if that publish fails (invariant I8).
        ``payload_json`` is ``payload`` already encoded, when the caller has it.
        While a run of the key is live and ``overlap`` is false, no flight message is
        published (the finishing run schedules the flight); at most a lease watchdog is.
        """
        raise NotImplementedError

    def abort_trigger(self, key_hash: str, seq: int, undo: dict[str, Any]) -> None:
        """Take back a trigger whose dispatch message could not be published (I8)."""
        raise NotImplementedError

    def fire(
        self,
        key_hash: str,
        seq: int | None,
        *,
        overlap: bool,
        lease: float,
        now: datetime | None = None,
        store: str | None = None,
        collect_limit: int | None = None,
    ) -> FireDecision:
        """Decide what a dispatch message does (step 2); claims the flight when it is due.

        ``seq=None`` skips the message fencing (in-process ``run_due``). ``store`` is the
        store that issued the message (used by ``auto``, which holds two). In collect mode a
        claim takes at most ``collect_limit`` items; the rest stay pending as the next flight.
        """
        raise NotImplementedError

    def finish(
        self,
        key_hash: str,
        run_id: int,
        *,
        ok: bool,
        error: str = "",
        retry_in: float | None = None,
        store: str | None = None,
        now: datetime | None = None,
    ) -> Dispatch | None:
        """Record the end of run ``run_id`` (step 3); returns the follow-up flight's message.

        ``retry_in`` (seconds, only with ``ok=False``): the run's triggers go back to pending
        and the flight runs again no earlier than ``retry_in`` seconds from now, joined by any
        trigger that arrives meanwhile; ``None`` records a final failure.
        """
        raise NotImplementedError

    def watch(
        self, key_hash: str, at: int, *, store: str | None = None, now: datetime | None = None
    ) -> Dispatch | None:
        """A lease watchdog arrived (``at``: the lease end it watches, microseconds).

        Redoes a run whose lease ran out (I7), schedules a flight left without a message,
        and re-arms the watchdog while a run is live. Returns the message to publish.
        """
        raise NotImplementedError

    def heartbeat(
        self,
        key_hash: str,
        run_id: int,
        lease: float,
        *,
        store: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        """Extend the lease of run ``run_id`` to now + ``lease`` seconds (step 4)."""
        raise NotImplementedError

    def flush(self, key_hash: str, *, now: datetime | None = None) -> Dispatch | None:
        """Make the pending flight due now (step 6); ``None`` when nothing is pending."""
        raise NotImplementedError

    def cancel(self, key_hash: str, *, now: datetime | None = None) -> int:
        """Drop the pending flight (step 6); returns how many triggers were dropped.

        Whatever the flight's state (nothing pending, a run live), the key's last trigger time
        is cleared, as lodash's ``cancel()`` clears ``lastCallTime``: the next trigger of a
        ``leading`` task leads at once. A live run is not interrupted.
        """
        raise NotImplementedError

    def due_keys(
        self, now: datetime | None = None, task_names: list[str] | None = None
    ) -> list[tuple[str, str]]:
        """``(task_name, key_hash)`` of keys whose flight is due at ``now`` (for ``run_due``)."""
        raise NotImplementedError

    def recover(
        self, *, grace: float, adopt: Any = (), now: datetime | None = None
    ) -> list[tuple[str, Dispatch]]:
        """Step 5: redo runs whose lease ran out and re-dispatch flights whose message is
        overdue by more than ``grace`` seconds. Returns ``(task_name, dispatch)`` to publish."""
        raise NotImplementedError

    def live_state(self, key_hash: str) -> dict[str, Any] | None:
        """Live counters of one key: ``pending``, ``flight_id``, ``triggers``, ``runs``,
        ``merged``, ``cancelled``, ``state`` (idle/pending/running), ``seq`` (the valid dispatch
        sequence) and ``store_code`` (``"d"``/``"r"``); ``None`` if unknown."""
        raise NotImplementedError

    def pending_counts(self, key_hashes: list[str]) -> dict[str, int]:
        """Live pending count per key hash (for the admin and the status command)."""
        raise NotImplementedError
