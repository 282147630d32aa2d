"""A pure reference model of one key's state machine (docs/design.md, "State machine"), for
the property tests in ``test_properties.py``.

No I/O and no clock of its own: every operation takes ``now`` in integer microseconds (the
fake clock of the test), and every duration is in microseconds too, so comparisons with the
real stores are exact. The operations and their answers mirror ``BaseBackend``; the rules are
those of the contract (the issue 4 brief), written once, as plainly as possible:

- ``trigger``: recover a lost lease; open a flight (lodash edges: leading / trailing / dropped)
  when nothing is pending; count the trigger; recompute ``due``; publish a flight message, or
  only a lease watchdog while a run of the key is live and ``overlap`` is off.
- ``abort_trigger``: take back a trigger whose message could not be published (I8): the key
  is left as if the trigger had not been made.
- ``fire``: fence stale messages; rearm early ones; wait for a live run; else claim (in collect
  mode at most ``collect_limit`` items; the rest stay as the next flight).
- ``finish``: ok / retry (the triggers go back to pending, with a backoff) / final failure;
  then schedule what is pending.
- ``watch``: the lease watchdog; ``heartbeat``; ``flush``; ``cancel``; ``recover``.

A live run whose lease ran out (``running_until <= now``) is lost at the start of ``trigger``,
``fire``, ``finish``, ``watch`` and ``recover``; its run id is appended to ``events`` so the
test's ledger can follow it.

Where the brief's wording broke an invariant, or left a point open, the model settles it
(and the stores were changed to match; see the commits on branch issue4-prop):

- a later trigger never makes an open flight due earlier than it was (I3: a lost or retried
  run that rejoins a flight brings an older first trigger, and first + max_wait would
  otherwise cut short the due time already given to newer triggers);
- ``heartbeat`` at exactly the lease end fails, as every other operation counts the run lost;
- ``abort_trigger`` that closes the flight puts back the key's last trigger time (I8: the
  next trigger's edge depends on it); when nothing came after the aborted trigger, collected
  items lose only its own item and a retry backoff that began since is kept; when triggers
  merged meanwhile, or a run rejoined the flight (a retry, a lost lease: its items may include
  the same one), its item goes only if the flight still holds one item per pending trigger
  (otherwise a merged trigger or the run may have sent it too, and it stays: a run too many
  rather than a trigger lost, I1); it takes a trigger back only while the trigger's flight
  is the pending one (a parked lease watchdog outlives its run: its time alone does not tell
  that the flight ran meanwhile);
- ``cancel`` clears the key's last trigger time, as lodash's ``cancel()`` does (both stores),
  whatever the flight's state: also when nothing is pending (it returns 0) and while a run is
  live, so the next trigger of a ``leading=True`` task leads at once (issue 15).

``max_wait`` is measured as lodash measures ``maxWait`` (issue 15): a flight's ``anchor`` is
the last run's claim (``last_run_at``, lodash's ``lastInvokeTime``) when the trigger that opens
the flight continues the stream (the key's last trigger less than ``wait`` ago and, with
``max_wait``, the last claim less than ``max_wait`` ago: lodash's ``shouldInvoke`` is false),
else the flight's first trigger (lodash's ``leadingEdge``). ``due = min(last + wait, anchor +
max_wait)``, never earlier than the due time the flight already has (I3). A lost or retried
run whose triggers rejoin the flight brings their first trigger time as anchor, and the
earlier one is kept (as ``first``); so the anchor is never later than ``first``.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

US = 1_000_000


def canon(value: Any) -> str:
    """Canonical JSON, the equality of collected items (as ``django_debounce.keys.dumps``)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def union(first: list[Any], then: list[Any]) -> list[Any]:
    """``first`` followed by the items of ``then`` not already in it (by JSON value)."""
    out = list(first)
    seen = {canon(i) for i in out}
    for item in then:
        if canon(item) not in seen:
            seen.add(canon(item))
            out.append(item)
    return out


@dataclass(frozen=True)
class Config:
    """A key's task configuration; durations in microseconds."""

    wait: int
    max_wait: int | None
    leading: bool
    trailing: bool
    overlap: bool
    collect_limit: int | None
    lease: int

    @property
    def collect(self) -> bool:
        return self.collect_limit is not None


@dataclass(frozen=True)
class Msg:
    """A message the caller must publish: ``kind="fire"`` (``seq`` is the fencing sequence of
    the model, counted from 0) or ``kind="watch"`` (``seq`` is the lease end it watches)."""

    seq: int
    countdown: int
    kind: str = "fire"


@dataclass(frozen=True)
class TriggerOut:
    flight_id: int
    pending: int
    due_at: int | None
    scheduled: bool


@dataclass(frozen=True)
class ClaimOut:
    run_id: int
    flight_id: int
    triggers: int
    payload: Any
    first_trigger_at: int | None
    last_trigger_at: int | None
    due_at: int | None
    started_at: int
    attempt: int


@dataclass(frozen=True)
class FireOut:
    action: str  # "drop", "rearm", "wait", "claim", "missing" (no state for the key)
    dispatch: Msg | None = None
    claim: ClaimOut | None = None


@dataclass
class KeyModel:
    """The state of one key. ``grace`` is DEBOUNCE_DISPATCH_GRACE in microseconds."""

    cfg: Config
    grace: int
    exists: bool = False
    pending: int = 0
    flight_id: int = 0
    first: int | None = None
    last: int | None = None
    due: int | None = None
    payload: Any = None
    seq: int = 0
    scheduled: bool = False
    scheduled_at: int | None = None
    watchdog_at: int | None = None
    run_id: int = 0
    running_until: int | None = None
    run_triggers: int = 0
    run_payload: Any = None
    run_first: int | None = None
    run_attempt: int = 0
    attempt: int = 0
    not_before: int | None = None
    due_fixed: bool = False
    anchor: int | None = None
    last_run_at: int | None = None
    triggers: int = 0
    runs: int = 0
    merged: int = 0
    cancelled: int = 0
    # not part of the contract's state: how many triggers were ever made (the abort rule's
    # "no trigger came after it"), and run ids lost since the caller last looked
    made: int = 0
    events: list[int] = field(default_factory=list)

    # -- helpers --------------------------------------------------------------------------

    def _schedule(self, at: int, now: int) -> Msg:
        self.seq += 1
        self.scheduled = True
        self.scheduled_at = at
        return Msg(self.seq, max(at - now, 0))

    def _watchdog(self, now: int) -> Msg | None:
        if self.running_until is None:
            return None
        if self.watchdog_at is not None and self.watchdog_at > now:
            return None
        self.watchdog_at = self.running_until
        return Msg(self.running_until, self.running_until - now, "watch")

    def _end_run(self) -> None:
        self.running_until = None
        self.run_triggers = 0
        self.run_payload = None
        self.run_first = None
        self.run_attempt = 0

    def _unclaim(self, now: int) -> None:
        claimed = self.run_triggers
        self.runs = max(self.runs - 1, 0)
        self.merged = max(self.merged - max(claimed - 1, 0), 0)
        if self.pending == 0:
            self.flight_id += 1
            self.first = self.run_first
            self.anchor = self.run_first
            self.last = self.last if self.last is not None else self.run_first
            self.payload = copy.deepcopy(self.run_payload)
            self.due = now
            self.due_fixed = False
        else:
            assert self.first is not None and self.run_first is not None
            self.first = min(self.first, self.run_first)
            assert self.anchor is not None
            self.anchor = min(self.anchor, self.run_first)
            if self.cfg.collect:
                self.payload = union(self.run_payload or [], self.payload or [])
        self.pending += claimed
        self.attempt = max(self.attempt, self.run_attempt)
        self._end_run()

    def _recover_lease(self, now: int) -> None:
        if self.running_until is None or self.running_until > now:
            return
        lost = self.run_id
        attempt = self.run_attempt
        self._unclaim(now)
        self.attempt = max(self.attempt, attempt + 1)  # a lost run counts as an attempt
        self.events.append(lost)

    def _continues(self, now: int) -> bool:
        """Whether a trigger at ``now`` that opens a flight continues the key's stream of
        triggers: lodash's ``shouldInvoke`` is false (the last trigger less than ``wait`` ago
        and, with ``max_wait``, the last run claimed less than ``max_wait`` ago)."""
        cfg = self.cfg
        if self.last is None or now - self.last >= cfg.wait:
            return False
        if cfg.max_wait is None:
            return True
        return self.last_run_at is not None and now - self.last_run_at < cfg.max_wait

    def _edge(self, continues: bool) -> str:
        cfg = self.cfg
        if cfg.leading and not continues:
            return "leading"
        return "trailing" if cfg.trailing else "drop"

    # -- operations -----------------------------------------------------------------------

    def trigger(self, now: int, payload: Any) -> tuple[TriggerOut, Msg | None, dict[str, Any]]:
        cfg = self.cfg
        self.exists = True
        self._recover_lease(now)
        self.made += 1
        undo: dict[str, Any] = {
            "opened": self.pending == 0,
            "payload": copy.deepcopy(self.payload),
            "last": self.last,
            "due": self.due,
            "due_fixed": self.due_fixed,
            "made": self.made,
            "added": False,
            "item": payload,
        }
        if self.pending == 0:
            continues = self._continues(now)
            edge = self._edge(continues)
            if edge == "drop":
                self.triggers += 1
                self.cancelled += 1
                self.last = now
                return TriggerOut(self.flight_id, 0, None, False), None, undo
            self.flight_id += 1
            self.first = now
            # the max_wait anchor: the last claim while the stream goes on (lodash's
            # lastInvokeTime), else this trigger (lodash's leadingEdge resets it)
            self.anchor = self.last_run_at if continues and cfg.max_wait is not None else now
            self.payload = [] if cfg.collect else None
            self.due_fixed = edge == "leading"
            self.attempt = 0
            self.not_before = None
        self.pending += 1
        self.triggers += 1
        self.last = now
        full = False
        if cfg.collect:
            assert cfg.collect_limit is not None
            items = list(self.payload or [])
            if canon(payload) not in {canon(i) for i in items}:
                items.append(payload)
                undo["added"] = True
            self.payload = items
            full = len(items) >= cfg.collect_limit
        else:
            self.payload = payload
        if self.due_fixed and not undo["opened"]:
            assert self.due is not None
            due = self.due
        elif self.due_fixed or full:
            due = now
        else:
            assert self.anchor is not None
            due = now + cfg.wait
            if cfg.max_wait is not None:
                due = min(due, self.anchor + cfg.max_wait)
            if not undo["opened"] and self.due is not None:
                # never earlier than the due time given to the flight's earlier triggers (I3):
                # a lost or retried run that rejoined it brought an older anchor
                due = max(due, self.due)
        if full:
            self.due_fixed = True
        if self.not_before is not None and due < self.not_before:
            due = self.not_before
        self.due = due
        dispatch = None
        if self.running_until is not None and not cfg.overlap:
            dispatch = self._watchdog(now)
        elif (
            not self.scheduled
            or (self.scheduled_at is not None and self.scheduled_at + self.grace < now)
            or (self.scheduled_at is not None and self.scheduled_at > due)
        ):
            dispatch = self._schedule(due, now)
        out = TriggerOut(
            self.flight_id, self.pending, self.due, dispatch is not None and dispatch.kind == "fire"
        )
        undo["pending"] = self.pending
        undo["flight"] = self.flight_id
        return out, dispatch, undo

    def abort_trigger(self, seq: int, undo: dict[str, Any], kind: str) -> bool:
        """Returns whether the trigger was taken back (its message still the current one, its
        flight still the pending one: a lease watchdog stays parked after its run, so its
        time alone does not tell that the trigger's flight ran meanwhile)."""
        if not self.exists or self.pending == 0 or self.flight_id != undo["flight"]:
            return False
        if kind == "watch":
            if self.watchdog_at != seq:
                return False
            self.watchdog_at = None
        else:
            if self.seq != seq or not self.scheduled:
                return False
            self.scheduled = False
            self.scheduled_at = None
        self.pending -= 1
        self.triggers -= 1
        restored = False
        if self.pending == 0:
            # the flight closes; the key is as before the trigger (I8), its last trigger time
            # included (the next trigger's edge depends on it)
            if undo["opened"]:
                self.flight_id -= 1
            self.first = self.anchor = self.due = None
            self.payload = None
            self.due_fixed = False
            self.last = undo["last"]
        elif self.made == undo["made"] and undo["due"] is not None:
            # no trigger came after it: the flight is as it was before it (collected items:
            # see below, as runs that rejoined the flight since may have added some)
            if not self.cfg.collect:
                self.payload = copy.deepcopy(undo["payload"])
            self.last = undo["last"]
            self.due = undo["due"]
            if self.not_before is not None:  # a retry's backoff that began since
                self.due = max(self.due, self.not_before)
            self.due_fixed = undo["due_fixed"]
            restored = True
        if self.pending and self.cfg.collect and undo["added"]:
            # The item it added goes when no pending trigger can have it too: nothing came
            # after it, nor did a run rejoin the flight (pending as the trigger left it; a
            # run's items may include it); or the flight holds one item per pending trigger,
            # so none of them sent it again. Otherwise it stays: a run too many rather than
            # a trigger lost (I1).
            alone = restored and self.pending + 1 == undo["pending"]
            if alone or len(self.payload or []) == self.pending + 1:
                self.payload = [i for i in self.payload or [] if canon(i) != canon(undo["item"])]
        return True

    def fire(self, now: int, seq: int | None) -> FireOut:
        cfg = self.cfg
        if not self.exists:
            return FireOut("missing")
        self._recover_lease(now)
        if seq is not None and (seq != self.seq or not self.scheduled):
            return FireOut("drop")
        if self.pending == 0:
            self.scheduled = False
            return FireOut("drop")
        if self.due is None:
            self.due = now
        if now < self.due:
            return FireOut("rearm", dispatch=self._schedule(self.due, now))
        if self.running_until is not None and not cfg.overlap:
            self.scheduled = False
            self.scheduled_at = None
            return FireOut("wait", dispatch=self._watchdog(now))
        # claim
        self.run_id += 1
        payload, rest = self.payload, None
        if cfg.collect and isinstance(payload, list) and len(payload) > (cfg.collect_limit or 0):
            assert cfg.collect_limit is not None
            payload, rest = payload[: cfg.collect_limit], payload[cfg.collect_limit :]
        claimed = self.pending - (len(rest) if rest else 0)
        claim = ClaimOut(
            run_id=self.run_id,
            flight_id=self.flight_id,
            triggers=claimed,
            payload=copy.deepcopy(payload),
            first_trigger_at=self.first,
            last_trigger_at=self.last,
            due_at=self.due,
            started_at=now,
            attempt=self.attempt,
        )
        self.running_until = now + cfg.lease
        self.run_triggers = claimed
        self.run_payload = copy.deepcopy(payload)
        self.run_first = self.first
        self.run_attempt = self.attempt
        self.runs += 1
        self.merged += claimed - 1
        self.attempt = 0
        self.not_before = None
        self.scheduled = False
        self.scheduled_at = None
        self.last_run_at = now
        follow = None
        if rest:
            assert cfg.collect_limit is not None
            self.flight_id += 1
            self.pending = len(rest)
            self.payload = rest
            self.due_fixed = len(rest) >= cfg.collect_limit
            if self.due_fixed:
                self.due = now
            if cfg.overlap:
                assert self.due is not None
                follow = self._schedule(self.due, now)
        else:
            self.pending = 0
            self.payload = None
            self.first = self.anchor = None
            self.due = None
            self.due_fixed = False
        return FireOut("claim", dispatch=follow, claim=claim)

    def current(self, run_id: int) -> bool:
        return self.run_id == run_id and self.running_until is not None

    def finish(self, now: int, run_id: int, *, ok: bool, retry_in: int | None) -> Msg | None:
        if not self.exists:
            return None
        lost = self.running_until is not None and self.running_until <= now
        self._recover_lease(now)
        if not self.current(run_id):
            # a late finisher after its lease ran out changes nothing; when it recovered the
            # lost run itself, it publishes that flight's message
            if lost and self.pending and self.running_until is None and not self.scheduled:
                return self._schedule(max(self.due if self.due is not None else now, now), now)
            return None
        if not ok and retry_in is not None:
            attempt = self.run_attempt + 1
            self._unclaim(now)
            self.attempt = attempt
            self.not_before = now + retry_in
            self.due = max(self.due if self.due is not None else now, self.not_before)
            self.due_fixed = False
        else:
            self._end_run()
        if self.pending:
            at = max(self.due if self.due is not None else now, now)
            if not self.scheduled or self.scheduled_at is None or self.scheduled_at > at:
                return self._schedule(at, now)
        return None

    def watch(self, now: int, at: int) -> Msg | None:
        if not self.exists:
            return None
        self._recover_lease(now)
        current = self.watchdog_at is None or self.watchdog_at == at or self.watchdog_at <= now
        if self.running_until is not None:
            if current:
                self.watchdog_at = None
                return self._watchdog(now)
            return None
        if current:
            self.watchdog_at = None
        if self.pending and not self.scheduled:
            return self._schedule(max(self.due if self.due is not None else now, now), now)
        return None

    def heartbeat(self, now: int, run_id: int, lease: int) -> bool:
        if not self.exists or not self.current(run_id):
            return False
        assert self.running_until is not None
        if self.running_until <= now:
            return False  # the lease ran out: the run is lost, whoever looks next
        self.running_until = now + lease
        return True

    def flush(self, now: int) -> Msg | None:
        if not self.exists or self.pending == 0:
            return None
        self.due = now
        self.not_before = None
        return self._schedule(now, now)

    def cancel(self, now: int) -> int:
        if not self.exists:
            return 0
        # the edge resets whatever the flight's state (lodash's cancel() clears lastCallTime):
        # the next trigger of a leading task leads at once, also after a cancel that dropped
        # nothing or while a run is live
        self.last = None
        if self.pending == 0:
            return 0
        dropped = self.pending
        self.cancelled += dropped
        self.pending = 0
        self.payload = None
        self.first = self.anchor = self.due = None
        self.due_fixed = False
        self.attempt = 0
        self.not_before = None
        self.seq += 1  # any outstanding message is now stale
        self.scheduled = False
        self.scheduled_at = None
        return dropped

    def recover(self, now: int, grace: int) -> Msg | None:
        if not self.exists:
            return None
        self._recover_lease(now)
        overdue = (
            self.scheduled and self.scheduled_at is not None and self.scheduled_at + grace < now
        )
        if self.pending and self.running_until is None and (not self.scheduled or overdue):
            return self._schedule(max(self.due if self.due is not None else now, now), now)
        return None

    # -- views ----------------------------------------------------------------------------

    def merge_until(self) -> int | None:
        """Until when a trigger of this key would be a plain merge (no edge, no new message,
        no lost lease, no backoff or fixed due time to apply, not collecting): the latest
        "merge until" a store may keep for its hot path (``None``: no hot path)."""
        if self.pending == 0 or self.due_fixed or self.not_before is not None:
            return None
        if self.cfg.collect:
            return None
        if self.running_until is None:
            return self.scheduled_at + self.grace if self.scheduled_at and self.scheduled else None
        if self.cfg.overlap:
            if self.scheduled and self.scheduled_at is not None:
                return min(self.scheduled_at + self.grace, self.running_until)
            return None
        if self.watchdog_at is not None:
            return min(self.running_until, self.watchdog_at)
        return None

    def is_due(self, now: int) -> bool:
        return self.pending > 0 and self.due is not None and self.due <= now

    def live_state(self) -> dict[str, Any] | None:
        if not self.exists:
            return None
        return {
            "pending": self.pending,
            "flight_id": self.flight_id,
            "triggers": self.triggers,
            "runs": self.runs,
            "merged": self.merged,
            "cancelled": self.cancelled,
            "state": "running"
            if self.running_until is not None
            else "pending"
            if self.pending
            else "idle",
            "seq": self.seq,
        }

    def view(self) -> dict[str, Any]:
        """The state a store keeps, in the shape ``test_properties.peek`` reads it from one."""
        collect = self.cfg.collect
        return {
            "pending": self.pending,
            "flight_id": self.flight_id,
            "first": self.first,
            "last": self.last,
            "due": self.due,
            "payload": (self.payload or []) if collect else self.payload,
            "due_fixed": self.due_fixed,
            "anchor": self.anchor,
            "attempt": self.attempt,
            "not_before": self.not_before,
            "seq": self.seq,
            "scheduled": self.scheduled,
            "scheduled_at": self.scheduled_at if self.scheduled else None,
            "watchdog_at": self.watchdog_at,
            "run_id": self.run_id,
            "running_until": self.running_until,
            "run_triggers": self.run_triggers,
            "run_payload": (self.run_payload or []) if collect else self.run_payload,
            "run_first": self.run_first,
            "run_attempt": self.run_attempt,
            "last_run_at": self.last_run_at,
            "triggers": self.triggers,
            "runs": self.runs,
            "merged": self.merged,
            "cancelled": self.cancelled,
        }
