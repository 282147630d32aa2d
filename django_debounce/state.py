"""Small value types returned by the stores and handed to task bodies."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class FlightOptions:
    """A debounced task's configuration as the stores need it (durations in seconds).

    ``wait``: quiet period; ``max_wait``: bound on how long a stream delays a run (``None``:
    unbounded; never below ``wait``); ``leading``/``trailing``: lodash's edges; ``overlap``:
    runs of one key may overlap; ``collect_limit``: collect mode (``None``: the payload is the
    last trigger's) and most items per run; ``lease``: how long a claimed run may go without
    finishing or having its lease extended before it counts as lost; ``collect_bytes``: most
    bytes of item JSON per run (at least one item; ``None``: no bound but ``collect_limit``).
    """

    wait: float
    max_wait: float | None = None
    leading: bool = False
    trailing: bool = True
    overlap: bool = False
    collect_limit: int | None = None
    lease: float = 300.0
    collect_bytes: int | None = None

    @property
    def collect(self) -> bool:
        """Whether triggers add items to a batch (``collect=True``)."""
        return self.collect_limit is not None


@dataclass(frozen=True)
class Dispatch:
    """A dispatch message to publish now, delivered ``countdown`` seconds later (at most the
    pump interval: longer waits stay in the store's due index).

    ``seq`` fences it (only the current sequence may claim); ``task_name`` is set by the
    pump's ``take`` (other steps publish for the task at hand); ``label`` is the readable key,
    which monitoring shows (``kwargsrepr``, cut to ``dispatch.LABEL`` characters).
    """

    key_hash: str
    seq: int
    countdown: float = 0.0
    task_name: str = ""
    label: str = ""  # the readable key, shown by Flower and `celery events`


@dataclass(frozen=True)
class Finish:
    """How a run ended: ``ok``; else ``error`` (its text) and ``retry_in`` (seconds until the
    retry, ``None`` for a final failure). ``give_up``: the flow gave the flight up without
    running it (its attempts ran out with lost runs): only the claimed triggers that an attempt
    covered fail; the others go back to pending, due at once (``Claim.attempted`` says how
    many were attempted). ``started_at``: the run's ``Claim.started_at``; when given, only
    the run claimed then is finished; ``None``: the run id alone says which run ends."""

    ok: bool
    error: str = ""
    retry_in: float | None = None
    give_up: bool = False
    started_at: datetime | None = None


@dataclass(frozen=True)
class IndexStats:
    """The due index of a store, for ``debounce_status`` and the metrics: ``depth`` (entries),
    ``due`` (entries due now), ``oldest_due_age`` (seconds the oldest due entry is overdue,
    0 when none is)."""

    depth: int
    due: int
    oldest_due_age: float


@dataclass(frozen=True)
class TriggerResult:
    """What ``task.trigger(...)`` returns.

    - ``key``: the readable key the trigger was counted under.
    - ``flight_id``: the flight it joined (``None`` while deferred to ``on_commit``).
    - ``pending``: triggers in that flight, this one included (``None`` while deferred).
    - ``due_at``: aware UTC datetime when the flight may run (``None`` while deferred).
    - ``scheduled``: ``True`` when this trigger published its flight's dispatch message at
      once and the broker took it (the flight was due within ``DEBOUNCE_PUMP_INTERVAL``);
      ``False`` when it was merged into a flight, when its flight waits in the due index for
      a pump, or when the publish failed (then ``publish_failed`` is ``True``). Whether it
      opened the flight: ``pending == 1``.
    - ``publish_failed``: ``True`` when this trigger's flight was due at once but the broker
      refused its dispatch message: the trigger is counted all the same, and the flight waits
      in the due index until a pump publishes it once the broker is back (invariant I8).
    - ``deferred``: ``True`` when the trigger waits for the surrounding transaction to commit.
    - ``dropped``: ``True`` when ``trailing=False`` dropped it inside a leading run's window
      (counted in ``cancelled``; no run will cover it, as lodash debounce).
    """

    key: str
    flight_id: int | None
    pending: int | None
    due_at: datetime | None
    scheduled: bool
    deferred: bool = False
    dropped: bool = False
    publish_failed: bool = False


@dataclass(frozen=True)
class Claim:
    """A due flight turned into a run by the worker (the *claim* step).

    ``payload`` is the last trigger's payload, or the list of collected items (``collect``);
    ``attempt`` counts the retries made before this run (0: first try); ``attempted`` how many
    of its triggers (collect: items, the first ones) an earlier attempt already covered.
    """

    key_hash: str
    key: str
    task_name: str
    run_id: int
    flight_id: int
    triggers: int
    payload: Any
    first_trigger_at: datetime
    last_trigger_at: datetime
    due_at: datetime
    started_at: datetime
    attempt: int = 0
    attempted: int = 0


class FireAction(enum.StrEnum):
    """What the worker does with a dispatch message (decided by the store)."""

    DROP = "drop"  # stale sequence, cancelled flight, nothing pending
    REARM = "rearm"  # arrived before due_at: back to the due index (or out again if due soon)
    WAIT = "wait"  # another run of the key is live: the finishing run schedules the flight
    CLAIM = "claim"  # run the body now
    MISSING = "missing"  # the store has no state for the key (e.g. Redis restarted empty)


@dataclass(frozen=True)
class FireDecision:
    """The store's answer to a dispatch message."""

    action: FireAction
    dispatch: Dispatch | None = None
    claim: Claim | None = None


@dataclass
class RunInfo:
    """Facts about the current run, given to a body that declares a ``debounce`` parameter.

    ``triggers`` is how many triggers this run covers (``merged = triggers - 1``);
    ``first_trigger_at``/``last_trigger_at`` are aware UTC datetimes; ``attempt`` counts
    the retries made before this run (0: first try, as Celery's ``request.retries``).
    In a worker the lease keeper extends the lease while the body runs; ``heartbeat()``
    extends it by hand (by the task's lease) and says whether the run still holds it.
    """

    key: str
    flight_id: int
    run_id: int
    triggers: int
    first_trigger_at: datetime
    last_trigger_at: datetime
    attempt: int = 0
    _heartbeat: Callable[[], bool] | None = field(default=None, repr=False)

    def heartbeat(self) -> bool:
        """Extend this run's lease; returns ``False`` when the run is no longer current."""
        return True if self._heartbeat is None else self._heartbeat()


@dataclass(frozen=True)
class KeyStatus:
    """What ``task.status(*args)`` says about one key, without triggering it.

    - ``key``: the readable key; ``state``: ``idle``, ``pending`` or ``running``;
    - ``pending``: triggers waiting in the open flight; ``flight_id`` its number;
    - ``due_at``: when the open flight may run (aware UTC; ``None`` when nothing is pending);
    - ``running``: a run of the key is live, holding its lease until ``lease_until``;
    - ``last_run_at``, ``last_outcome``: the last run's start and outcome (``success``,
      ``failure``, ``retry``, ``lost``, or ``""``);
    - ``triggers``, ``runs`` (retried and lost runs left out), ``merged``, ``cancelled``: totals.
    """

    key: str
    state: str
    pending: int
    flight_id: int
    due_at: datetime | None
    running: bool
    lease_until: datetime | None
    last_run_at: datetime | None
    last_outcome: str
    triggers: int
    runs: int
    merged: int
    cancelled: int
