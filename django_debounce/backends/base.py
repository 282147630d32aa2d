"""The store contract: the operations of the per-key state machine and the due index
(docs/design.md, "State machine", "Dispatch at scale"). Every store implements them with the
semantics of ``django_debounce/machine.py``; ``now`` arguments replace the store's clock for
one call (``None``: its own); durations are seconds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django_debounce.state import (
    Dispatch,
    Finish,
    FireDecision,
    FlightOptions,
    IndexStats,
    TriggerResult,
)


@dataclass(frozen=True)
class Taken:
    """What one ``take`` of the pump got: the ``dispatches`` to publish (each with its task's
    name), how many of them were taken ``again`` (their message was out longer than
    ``DEBOUNCE_DISPATCH_GRACE``; the same sequence number goes out again), and ``next_in``:
    seconds until the earliest entry left in the index (``None``: the index is empty)."""

    dispatches: list[Dispatch] = field(default_factory=list)
    again: int = 0
    next_in: float | None = None


@dataclass(frozen=True)
class LiveRun:
    """A run the lease keeper keeps alive: claimed by message ``seq`` of ``key_hash`` for task
    ``task_name`` (whose options the store needs), with a lease of ``lease`` seconds."""

    key_hash: str
    seq: int
    lease: float
    task_name: str
    options: FlightOptions


class BaseBackend:
    """Operations of the state machine. Every method is atomic in its store (one Lua script,
    one database transaction), except where it says it works in batches."""

    name = "base"

    # -- triggers ---------------------------------------------------------------------------

    def trigger(
        self,
        *,
        task_name: str,
        key: str,
        key_hash: str,
        payload_json: str,
        options: FlightOptions,
        now: datetime | None = None,
    ) -> tuple[TriggerResult, Dispatch | None]:
        """Count one trigger (``payload_json``: canonical JSON; one item in collect mode).

        Edges as lodash debounce: with ``leading``, a trigger that opens a flight when the
        key's last trigger is ``wait`` or more ago (or its last run ``max_wait`` or more ago)
        makes a flight due at once; with ``trailing=False`` a trigger that would open any
        other flight is dropped (counted in ``cancelled``). ``max_wait`` counts from the
        flight's anchor (the last run's claim while the stream goes on, else the first
        trigger). The open flight enters the due index at its due time; a flight due within
        the pump interval is returned as a ``Dispatch`` for the caller to publish at once
        (on failure the caller calls ``release``). Returns ``(result, dispatch or None)``.
        """
        raise NotImplementedError

    def trigger_many(
        self,
        *,
        task_name: str,
        items: Sequence[tuple[str, str, str]],
        options: FlightOptions,
        now: datetime | None = None,
    ) -> list[tuple[TriggerResult, Dispatch | None]]:
        """``trigger`` for each ``(key, key_hash, payload_json)`` of ``items``, in order (the
        triggers of one key merge as usual); stores batch the round trips and the durable
        writes. Returns one ``(result, dispatch)`` per item."""
        return [
            self.trigger(
                task_name=task_name,
                key=key,
                key_hash=hashed,
                payload_json=payload,
                options=options,
                now=now,
            )
            for key, hashed, payload in items
        ]

    # -- the pump -----------------------------------------------------------------------------

    def peek(
        self, task_names: Sequence[str] | None, *, now: datetime | None = None
    ) -> float | None:
        """Seconds until the earliest index entry of ``task_names`` (all tasks: ``None``) needs
        attention (0 or less: due now); ``None`` when there is none. Read-only and cheap: a
        pump calls it every tick."""
        raise NotImplementedError

    def take(
        self,
        tasks: Mapping[str, FlightOptions] | None,
        limit: int,
        *,
        now: datetime | None = None,
    ) -> Taken:
        """Take at most ``limit`` due index entries of ``tasks`` (task name -> its options;
        ``None``: every registered debounced task),
        atomically (concurrent pumps never take one entry twice): publish-ready flights get
        their message (a fresh sequence, or the same one again when the message out was not
        claimed within ``DEBOUNCE_DISPATCH_GRACE``) and an entry at that deadline; runs whose
        lease ran out are redone (I7); entries that were early move to the time their key
        needs. Never publishes anything itself."""
        raise NotImplementedError

    def release(self, dispatches: Sequence[Dispatch], *, now: datetime | None = None) -> None:
        """The messages of ``dispatches`` could not be published: their flights go back to the
        due index at their due time (a later take publishes them; a trigger never fails
        because the broker is down, I8)."""
        raise NotImplementedError

    # -- the worker ---------------------------------------------------------------------------

    def fire(
        self,
        key_hash: str,
        seq: int | None,
        *,
        task_name: str,
        options: FlightOptions,
        now: datetime | None = None,
    ) -> FireDecision:
        """Decide what a dispatch message does; claims the flight when it is due.

        ``seq=None`` skips the message fencing (in-process ``run_due``). A message that comes
        early puts its flight back in the index (REARM, with a ``Dispatch`` when it is due
        within the pump interval); one that finds a live run of the key (no overlap) leaves
        the flight to that run's finish (WAIT). In collect mode a claim takes at most
        ``collect_limit`` items; the rest stay pending as the next flight.
        """
        raise NotImplementedError

    def finish(
        self,
        key_hash: str,
        run_id: int,
        end: Finish,
        *,
        task_name: str,
        options: FlightOptions,
        now: datetime | None = None,
    ) -> Dispatch | None:
        """Record the end of run ``run_id``; returns the follow-up flight's message when it is
        due within the pump interval (else the flight waits in the index).

        ``end.retry_in`` (only with ``ok=False``): the run's triggers go back to pending and
        run again no earlier than ``retry_in`` seconds from now, joined by triggers that
        arrive meanwhile; ``None`` records a final failure. A finish of a run that is no
        longer current (its lease ran out) changes nothing.
        """
        raise NotImplementedError

    def heartbeat(
        self,
        key_hash: str,
        run_id: int,
        lease: float,
        *,
        task_name: str,
        options: FlightOptions,
        now: datetime | None = None,
    ) -> bool:
        """Extend the lease of run ``run_id`` to now + ``lease`` seconds; ``False`` when that
        run is not the live one (a lease that ran out is never extended)."""
        raise NotImplementedError

    def extend(
        self,
        runs: Sequence[LiveRun],
        *,
        now: datetime | None = None,
    ) -> list[float | None]:
        """The lease keeper's batch: extend each live run (the one its message ``seq``
        claimed) to now + its ``lease``. Returns, per run, the seconds until its new lease
        end, or ``None`` when that run is not live any more (lost, or finished)."""
        raise NotImplementedError

    # -- operators ------------------------------------------------------------------------------

    def flush(
        self,
        key_hash: str,
        *,
        task_name: str,
        options: FlightOptions,
        now: datetime | None = None,
    ) -> Dispatch | None:
        """Make the pending flight due now; returns its message (``None`` when nothing is
        pending, or a live run of the key finishes first)."""
        raise NotImplementedError

    def cancel(
        self,
        key_hash: str,
        *,
        task_name: str,
        options: FlightOptions,
        now: datetime | None = None,
    ) -> int:
        """Drop the pending flight and reset the key's edge (lodash's ``cancel()``: the next
        trigger starts a new burst); returns how many triggers were dropped."""
        raise NotImplementedError

    def due_keys(
        self, now: datetime | None = None, task_names: Sequence[str] | None = None
    ) -> list[tuple[str, str]]:
        """``(task_name, key_hash)`` of keys whose row says their flight is due at ``now``
        (for ``run_due``; on the Redis store a counter's merges may make it due later)."""
        raise NotImplementedError

    # -- reading -------------------------------------------------------------------------------

    def live_state(self, key_hash: str) -> dict[str, Any] | None:
        """Live counters of one key: ``pending``, ``flight_id``, ``triggers``, ``runs``,
        ``merged``, ``cancelled``, ``state`` (idle/pending/running) and ``seq`` (the valid
        dispatch sequence); ``None`` if unknown."""
        raise NotImplementedError

    def live_rows(self, key_hashes: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Live ``DebounceKey`` field values of the keys this store holds (the admin and the
        status command show them); keys it does not hold are left out."""
        raise NotImplementedError

    def pending_counts(self, key_hashes: Sequence[str]) -> dict[str, int]:
        """Live pending count per key hash."""
        raise NotImplementedError

    def index_stats(self, task_names: Sequence[str] | None = None) -> dict[str, IndexStats]:
        """The due index per task name (of ``task_names``, or every task it holds)."""
        raise NotImplementedError
