"""The rules of one key's state machine, in pure Python: the database store applies them to a
key's row under its row lock, and the tests hold every store to them
(``tests/stores/test_properties.py``). docs/design.md states them in prose: "Vocabulary"
(lodash's edges, the anchor, a plain merge), "State machine" (the due index and its entry,
scheduling, time-based sequence numbers, lost leases, flush, take, release) and "Dispatch at
scale".

No I/O and no clock of its own: every operation takes ``now`` in integer microseconds, and
every duration is in microseconds too. The operations and their answers mirror ``BaseBackend``;
a lost run's id is appended to ``events`` so the tests' ledger can follow it.
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


def _min(a: int | None, b: int | None) -> int | None:
    """The smaller of two optional times (``None``: none)."""
    if a is None:
        return b
    return a if b is None else min(a, b)


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
    collect_bytes: int | None = None

    @property
    def collect(self) -> bool:
        return self.collect_limit is not None

    def batch(self, items: list[Any]) -> int:
        """How many of ``items`` one run takes: at most ``collect_limit``, and at most
        ``collect_bytes`` bytes of their JSON (never fewer than one)."""
        assert self.collect_limit is not None
        took, used = 0, 0
        for item in items[: self.collect_limit]:
            size = len(canon(item).encode())
            if self.collect_bytes and took and used + size > self.collect_bytes:
                break
            took, used = took + 1, used + size
        return took


@dataclass(frozen=True)
class Msg:
    """A message the caller must publish now: ``seq`` fences it, ``countdown`` (microseconds,
    at most ``direct``) delays it in the broker."""

    seq: int
    countdown: int


@dataclass(frozen=True)
class TriggerOut:
    flight_id: int
    pending: int
    due_at: int | None
    scheduled: bool  # this trigger made the flight's message go out (a direct publish)
    merged: bool = False  # a plain merge: the index entry stays where it was


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
    flushed: bool = False  # the claim started a run a flush claimed (its run row exists)


@dataclass
class KeyModel:
    """The state of one key. ``retake`` is DEBOUNCE_DISPATCH_GRACE and ``direct`` the pump
    interval (DEBOUNCE_PUMP_INTERVAL), both in microseconds."""

    cfg: Config
    retake: int
    direct: int
    exists: bool = False
    pending: int = 0
    flight_id: int = 0
    first: int | None = None
    last: int | None = None
    anchor: int | None = None
    bound: int | None = None  # the smallest anchor + max_wait among the flight's triggers
    due: int | None = None
    payload: Any = None
    seq: int = 0
    taken: bool = False
    taken_at: int | None = None  # when the message is meant to arrive (publish time + countdown)
    entry: int | None = None
    run_id: int = 0
    run_seq: int = 0
    running_until: int | None = None
    run_triggers: int = 0
    run_payload: Any = None
    run_first: int | None = None
    run_anchor: int | None = None
    run_bound: int | None = None
    run_attempted: int = 0
    run_attempt: int = 0
    run_flight: int = 0  # the flight the live run claimed
    run_last: int | None = None  # its last trigger
    run_due: int | None = None  # its due time
    # False: a flush claimed the live run and its message has not started it yet (``fire``)
    run_started: bool = True
    attempt: int = 0
    attempted: int = 0  # triggers of the open flight that an attempt (a lost or failed run) covered
    not_before: int | None = None
    due_fixed: bool = False
    last_run_at: int | None = None
    triggers: int = 0
    runs: int = 0
    merged: int = 0
    cancelled: int = 0
    # not part of the contract's state: run ids lost since the caller last looked, and run
    # ids a flush claimed that went back to pending before their message started them
    events: list[int] = field(default_factory=list)
    returned: list[int] = field(default_factory=list)

    # -- helpers --------------------------------------------------------------------------

    def _next_seq(self, now: int) -> int:
        self.seq = max(self.seq + 1, now)
        return self.seq

    def _live(self) -> bool:
        return self.running_until is not None

    def _attention(self) -> int | None:
        """When the key next needs attention (the entry's score), ``None`` for never."""
        times = []
        if self.running_until is not None:
            times.append(self.running_until)
        if self.pending and (self.running_until is None or self.cfg.overlap):
            if self.taken:
                assert self.taken_at is not None
                times.append(self.taken_at + self.retake)
            else:
                assert self.due is not None
                times.append(self.due)
        return min(times) if times else None

    def _reindex(self) -> None:
        self.entry = self._attention()

    def _untake(self) -> None:
        """No message of the flight is out: the index holds it."""
        self.taken = False
        self.taken_at = None

    def _schedule(self, at: int, now: int) -> Msg | None:
        """The flight is due at ``at``: within ``direct`` of now its message goes out at once
        (marked taken, returned for the caller to publish); otherwise it waits in the index."""
        if at - now <= self.direct:
            seq = self._next_seq(now)
            self.taken = True
            self.taken_at = max(at, now)
            return Msg(seq, max(at - now, 0))
        self._untake()
        return None

    def _close_flight(self) -> None:
        """No flight is open any more: nothing pending, no payload, no times."""
        self.pending = 0
        self.payload = None
        self.first = self.anchor = self.bound = self.due = None
        self.due_fixed = False
        self.attempted = 0

    def _end_run(self) -> None:
        self.running_until = None
        self.run_seq = 0
        self.run_triggers = 0
        self.run_payload = None
        self.run_first = None
        self.run_anchor = None
        self.run_bound = None
        self.run_attempted = 0
        self.run_attempt = 0
        self.run_flight = 0
        self.run_last = None
        self.run_due = None
        self.run_started = True

    def _unclaim(self, now: int) -> None:
        claimed = self.run_triggers
        self.runs = max(self.runs - 1, 0)
        self.merged = max(self.merged - max(claimed - 1, 0), 0)
        size = self._run_size()
        started, attempted = self.run_started, self.run_attempted
        self._rejoin(now, claimed, self.run_payload)
        # every claimed trigger (collect: item) was attempted now (the run failed or was
        # lost); a run that never started attempted none: only what it took stays attempted
        self.attempted += size if started else attempted
        self.attempt = max(self.attempt, self.run_attempt)
        self._end_run()

    def _return_unstarted(self, now: int) -> None:
        """The live run a flush claimed goes back to pending before its message started it
        (its message was refused, came too late, or a claim with ``overlap=True`` takes its
        triggers): as a lost run's, but no attempt is counted."""
        run_id = self.run_id
        self._unclaim(now)
        self.returned.append(run_id)

    def _rejoin(self, now: int, claimed: int, run_payload: Any) -> None:
        """``claimed`` triggers of the live run go back to pending with ``run_payload``: as the
        open flight, due at once, when nothing is pending; else into it (the newer payload
        wins; collected items of the run come first; the earlier first trigger, anchor and
        bound are kept)."""
        if self.pending == 0:
            self.flight_id += 1
            self.first = self.run_first
            self.anchor = self.run_anchor
            self.bound = self.run_bound
            self.last = self.last if self.last is not None else self.run_first
            self.payload = copy.deepcopy(run_payload)
            self.due = now
            self.due_fixed = False
            self._untake()
            self.attempted = 0
        else:
            assert self.first is not None and self.run_first is not None
            self.first = min(self.first, self.run_first)
            assert self.anchor is not None and self.run_anchor is not None
            self.anchor = min(self.anchor, self.run_anchor)
            self.bound = _min(self.bound, self.run_bound)
            if self.cfg.collect:
                self.payload = union(run_payload or [], self.payload or [])
        self.pending += claimed

    def _recover_lease(self, now: int) -> bool:
        if self.running_until is None or self.running_until > now:
            return False
        if not self.run_started:
            # a flushed run whose message did not start it within ``retake``
            self._return_unstarted(now)
            return True
        lost = self.run_id
        attempt = self.run_attempt
        self._unclaim(now)
        self.attempt = max(self.attempt, attempt + 1)  # a lost run counts as an attempt
        self.events.append(lost)
        return True

    def _edge(self, now: int, wait: int, max_wait: int | None) -> str:
        cfg = self.cfg
        if cfg.leading:
            if self.last is None or now - self.last >= wait:
                return "leading"
            if max_wait is not None and (
                self.last_run_at is None or now - self.last_run_at >= max_wait
            ):
                return "leading"
        return "trailing" if cfg.trailing else "drop"

    def _anchor(self, now: int, wait: int, max_wait: int | None) -> int:
        """Where ``max_wait`` of a flight opened now counts from (lodash's lastInvokeTime):
        the last run's claim while the stream goes on, else now."""
        if (
            max_wait is not None
            and self.last is not None
            and now - self.last < wait
            and self.last_run_at is not None
            and now - self.last_run_at < max_wait
        ):
            return self.last_run_at
        return now

    def options(self, wait: int | None, max_wait: int | None) -> tuple[int, int | None]:
        """A trigger's ``wait`` and ``max_wait``: its own when given, else the task's;
        ``max_wait`` is never below ``wait`` (as lodash's)."""
        wait = self.cfg.wait if wait is None else wait
        max_wait = self.cfg.max_wait if max_wait is None else max_wait
        if max_wait is not None and max_wait < wait:
            max_wait = wait
        return wait, max_wait

    def is_plain_merge(self, now: int) -> bool:
        """Whether a trigger now may be a plain merge: it joins an open flight (no edge, no
        lost lease to recover, not collecting). It is one when it also moves the flight's
        due time no earlier (``trigger``): then nothing in the index moves."""
        if self.cfg.collect or self.pending == 0:
            return False
        return self.running_until is None or self.running_until > now

    def _due_of(self, now: int, wait: int, bound: int | None) -> int:
        """The due time a trigger at ``now`` with ``wait`` gives an open flight whose bound is
        ``bound`` (as lodash restarts its timer at each call: this call's time plus this
        call's wait, at most the bound; a fixed due time stays; never before a backoff)."""
        assert self.due is not None
        due = self.due
        if not self.due_fixed:
            due = now + wait if bound is None else min(now + wait, bound)
        return due if self.not_before is None else max(due, self.not_before)

    # -- operations -----------------------------------------------------------------------

    def trigger(
        self, now: int, payload: Any, wait: int | None = None, max_wait: int | None = None
    ) -> tuple[TriggerOut, Msg | None]:
        """A trigger; ``wait``/``max_wait`` (its own, or ``None``: the task's) decide its
        edge, and its due time: ``last + wait`` bounded by the smallest ``anchor + max_wait``
        among the flight's triggers."""
        cfg = self.cfg
        wait, max_wait = self.options(wait, max_wait)
        self.exists = True
        if self.is_plain_merge(now):
            assert self.due is not None and self.anchor is not None
            bound = self.bound
            if max_wait is not None:
                bound = _min(bound, self.anchor + max_wait)
            due = self._due_of(now, wait, bound)
            if due >= self.due:  # else: earlier, so the index must move (below)
                self.pending += 1
                self.triggers += 1
                self.last = now
                self.payload = payload
                self.bound = bound
                self.due = due
                return TriggerOut(self.flight_id, self.pending, self.due, False, True), None
        self._recover_lease(now)
        opened = self.pending == 0
        if opened:
            edge = self._edge(now, wait, max_wait)
            if edge == "drop":
                self.triggers += 1
                self.cancelled += 1
                self.last = now
                self._reindex()
                return TriggerOut(self.flight_id, 0, None, False), None
            self.flight_id += 1
            self.first = now
            self.anchor = self._anchor(now, wait, max_wait)
            self.bound = None
            self.payload = [] if cfg.collect else None
            self.due_fixed = edge == "leading"
            self.attempt = 0
            self.attempted = 0
            self.not_before = None
            self._untake()
        self.pending += 1
        self.triggers += 1
        self.last = now
        full = False
        if cfg.collect:
            assert cfg.collect_limit is not None
            items = list(self.payload or [])
            if canon(payload) not in {canon(i) for i in items}:
                items.append(payload)
            self.payload = items
            full = len(items) >= cfg.collect_limit
        else:
            self.payload = payload
        if max_wait is not None and self.anchor is not None:
            self.bound = _min(self.bound, self.anchor + max_wait)
        if self.due_fixed and not opened:
            assert self.due is not None
            due = self.due
        elif self.due_fixed or full:
            due = now
        else:
            assert self.anchor is not None
            due = now + wait
            if self.bound is not None:
                due = min(due, self.bound)
        if full:
            self.due_fixed = True
        if self.not_before is not None and due < self.not_before:
            due = self.not_before
        self.due = due
        dispatch = None
        if self._live() and not cfg.overlap:
            pass  # the finishing run schedules the flight; the lease end is in the index
        elif not self.taken or (self.taken_at is not None and self.taken_at > due):
            # no message out, or the one out is for a later time (a collected flight that
            # became full): the flight is scheduled anew
            dispatch = self._schedule(due, now)
        self._reindex()
        return TriggerOut(self.flight_id, self.pending, self.due, dispatch is not None), dispatch

    def fold(
        self, count: int, last: int, wait: int | None = None, max_wait: int | None = None
    ) -> None:
        """``count`` triggers that a Redis counter absorbed for the open flight, the last of
        them at ``last``, each with ``wait``/``max_wait`` (``None``: the task's), join it as
        that many plain merges with the flight's payload would have (docs/design.md, "The
        counter and its fences"): the same pending count, totals, last trigger time and due
        time."""
        if count <= 0:
            return
        assert self.pending > 0 and self.anchor is not None and self.due is not None
        wait, max_wait = self.options(wait, max_wait)
        self.pending += count
        self.triggers += count
        if self.last is not None and last < self.last:
            return  # a later trigger on the row path set the due time (the last one wins)
        self.last = last
        if max_wait is not None:
            self.bound = _min(self.bound, self.anchor + max_wait)
        self.due = self._due_of(last, wait, self.bound)

    def take(self, now: int) -> tuple[Msg | None, bool]:
        """The pump found the key's entry due (``entry <= now``): publish its flight's message
        when the flight is due (a fresh sequence, or the same one again when the message out
        was not claimed within ``retake``), recover a lost lease, or move an early entry to
        the time the key needs. Returns ``(message, re-taken)``."""
        assert self.entry is not None and self.entry <= now
        self._recover_lease(now)
        msg, again = None, False
        if self.pending and (not self._live() or self.cfg.overlap):
            assert self.due is not None
            if self.due <= now:
                if self.taken:
                    again = True
                else:
                    self._next_seq(now)
                self.taken = True
                self.taken_at = now
                msg = Msg(self.seq, 0)
        self._reindex()
        return msg, again

    def release(self, now: int, seq: int) -> bool:
        """The message ``seq`` could not be published: the flight goes back to the index at
        its due time (the next take publishes it). Returns whether it applied."""
        if not self.exists:
            return False
        if self._live() and not self.run_started and self.run_seq == seq:
            # a flush's message: its run has no message to start it any more; its lease ends
            # now, so the next step (the pump's take) puts its triggers back, due at once
            assert self.running_until is not None
            self.running_until = min(self.running_until, now)
            self._reindex()
            return True
        if not self.taken or self.seq != seq:
            return False
        self._untake()
        self._reindex()
        return True

    def fire(self, now: int, seq: int | None) -> FireOut:
        cfg = self.cfg
        if not self.exists:
            return FireOut("missing")
        self._recover_lease(now)
        if seq is not None and self._live() and not self.run_started and self.run_seq == seq:
            # the message of a flush starts the run the flush claimed: its lease from now
            self.run_started = True
            self.running_until = now + cfg.lease
            self._reindex()
            return FireOut("claim", claim=self.run_claim(), flushed=True)
        if seq is not None and (seq != self.seq or not self.taken):
            self._reindex()
            return FireOut("drop")
        if self.pending == 0:
            self._untake()
            self._reindex()
            return FireOut("drop")
        assert self.due is not None
        if now < self.due:
            # early (the flight moved later after its message went out): back to the index,
            # or out again at once when due within `direct`
            msg = self._schedule(self.due, now)
            self._reindex()
            return FireOut("rearm", dispatch=msg)
        if self._live() and not cfg.overlap:
            # the finishing run schedules this flight; the live run's lease end is indexed
            self._untake()
            self._reindex()
            return FireOut("wait")
        claim, follow = self._claim(now, seq)
        # an entry earlier than the key needs stays (a take moves an early entry): a claim of
        # a flight whose message went out within DEBOUNCE_DISPATCH_GRACE writes no entry
        needed = self._attention()
        if self.entry is None or needed is None or needed < self.entry:
            self.entry = needed
        return FireOut("claim", dispatch=follow, claim=claim)

    def run_claim(self) -> ClaimOut:
        """The live run as its claim answered (``fire`` of a flush's message answers it)."""
        assert self.running_until is not None and self.last_run_at is not None
        return ClaimOut(
            run_id=self.run_id,
            flight_id=self.run_flight,
            triggers=self.run_triggers,
            payload=copy.deepcopy(self.run_payload),
            first_trigger_at=self.run_first,
            last_trigger_at=self.run_last,
            due_at=self.run_due,
            started_at=self.last_run_at,
            attempt=self.run_attempt,
        )

    def _claim(
        self, now: int, seq: int | None, *, started: bool = True
    ) -> tuple[ClaimOut, Msg | None]:
        """The pending flight becomes the live run (``fire``'s claim, or a flush's with
        ``started=False``: its lease is then ``retake``, the time its message has to start
        it). A run a flush claimed that has not started yet (``overlap=True`` only) goes back
        to pending first, and this claim takes its triggers too. Returns the claim and the
        message of the collected items left over (``overlap=True``)."""
        cfg = self.cfg
        if self._live() and not self.run_started:
            self._return_unstarted(now)
        self.run_id += 1
        payload, rest = self.payload, None
        cut = False
        if cfg.collect and isinstance(payload, list):
            took = cfg.batch(payload)
            if took < len(payload):
                payload, rest = payload[:took], payload[took:]
                cut = took < (cfg.collect_limit or 0)
        claimed = self.pending - (len(rest) if rest else 0)
        self.running_until = now + (cfg.lease if started else self.retake)
        self.run_seq = seq or 0
        self.run_started = started
        self.run_flight = self.flight_id
        self.run_last = self.last
        self.run_due = self.due
        self.run_triggers = claimed
        self.run_payload = copy.deepcopy(payload)
        self.run_first = self.first
        self.run_anchor = self.anchor
        self.run_bound = self.bound
        self.run_attempt = self.attempt
        # the attempted triggers (collect: items) come first, so the run takes them first
        size = len(payload or []) if cfg.collect else claimed
        self.run_attempted = min(self.attempted, size)
        self.attempted -= self.run_attempted
        self.runs += 1
        self.merged += claimed - 1
        self.attempt = 0
        self.not_before = None
        self._untake()
        self.last_run_at = now
        claim = self.run_claim()
        follow = None
        if rest:
            assert cfg.collect_limit is not None
            self.flight_id += 1
            self.pending = len(rest)
            self.payload = rest
            self.due_fixed = len(rest) >= cfg.collect_limit or cut
            if self.due_fixed:
                self.due = now
            if cfg.overlap and started:
                # (after a flush the index holds them: a flush answers its own message only)
                assert self.due is not None
                follow = self._schedule(self.due, now)
        else:
            self._close_flight()
        return claim, follow

    def current(self, run_id: int) -> bool:
        return self.run_id == run_id and self.running_until is not None

    def finish(
        self, now: int, run_id: int, *, ok: bool, retry_in: int | None, give_up: bool = False
    ) -> Msg | None:
        """The end of run ``run_id``: ``ok``; a failure to retry in ``retry_in``; a final
        failure; or, with ``give_up`` (the flow gave the flight up without running it: its
        attempts ran out), a final failure of the claimed triggers that an attempt covered,
        while the others (triggers that came after the lost attempt) go back to pending,
        due at once, with no attempt made."""
        if not self.exists:
            return None
        lost = self._recover_lease(now)
        if not self.current(run_id):
            # a late finisher after its lease ran out changes nothing; when it recovered the
            # lost run itself, it schedules that flight
            msg = None
            if lost and self.pending and not self._live() and not self.taken:
                assert self.due is not None
                msg = self._schedule(max(self.due, now), now)
            self._reindex()
            return msg
        if not ok and retry_in is not None:
            attempt = self.run_attempt + 1
            self._unclaim(now)
            self.attempt = attempt
            self.not_before = now + retry_in
            self.due = max(self.due if self.due is not None else now, self.not_before)
            self.due_fixed = False
        elif give_up and 0 < self.run_attempted < self._run_size():
            self._give_up(now)
        else:
            self._end_run()
        msg = None
        if self.pending:
            assert self.due is not None
            at = max(self.due, now)
            if not self.taken or (self.taken_at is not None and self.taken_at > at):
                msg = self._schedule(at, now)
        self._reindex()
        return msg

    def _run_size(self) -> int:
        """The live run's claimed triggers (collect: items)."""
        return len(self.run_payload or []) if self.cfg.collect else self.run_triggers

    def _give_up(self, now: int) -> None:
        """The live run is given up for the triggers an attempt covered; the others go back
        to pending (a flight due at once, no attempt made)."""
        if self.cfg.collect:
            back_payload = (self.run_payload or [])[self.run_attempted :]
            back = len(back_payload)
        else:
            back_payload = self.run_payload
            back = self.run_triggers - self.run_attempted
        self.merged = max(self.merged - back, 0)
        attempted, pending_before = self.attempted, self.pending
        self._rejoin(now, back, back_payload)
        self.attempted = attempted if pending_before else 0
        if not pending_before:
            self.attempt = 0
        self._end_run()

    def heartbeat(self, now: int, run_id: int, lease: int) -> bool:
        """Extend run ``run_id``'s lease to ``now + lease`` (a lease that ran out is not)."""
        if not self.exists or not self.current(run_id) or not self.run_started:
            return False
        assert self.running_until is not None
        if self.running_until <= now:
            return False  # the lease ran out: the run is lost, whoever looks next
        self.running_until = now + lease
        self._reindex()
        return True

    def extend(self, now: int, seq: int, lease: int) -> int | None:
        """The lease keeper: extend the live run claimed by message ``seq``; returns the new
        lease end, or ``None`` when that run is not the live one (lost, or finished)."""
        if not self.exists or self.running_until is None or self.run_seq != seq or not seq:
            return None
        if not self.run_started:
            return None  # a flush's run that its message has not started: no worker has it
        if self.running_until <= now:
            return None
        self.running_until = now + lease
        self._reindex()
        return self.running_until

    def flush(self, now: int, hold: int | None = None) -> Msg | None:
        """Run the pending flight now (lodash's ``flush()``): unless a live run blocks it, the
        flush claims it at once (a run not started yet, its lease ``retake``) and answers the
        message that starts it (``fire`` with its sequence); triggers after the flush form
        the next flight. A live run with ``overlap=False`` blocks it: the flight is due now,
        and stays so (``due_fixed``) until the finishing run schedules it. ``hold``: a Redis
        counter that could not be sealed may count triggers of the flight until then: the
        flight is due at ``hold``, and claimed then as any due flight."""
        if not self.exists:
            return None
        lost = self._recover_lease(now)
        if self.pending == 0:
            if lost:
                self._reindex()
            return None
        self.not_before = None
        self.due_fixed = True
        if hold is not None and hold > now:
            self.due = hold
        else:
            self.due = now
        if self._live() and not self.cfg.overlap:
            self._untake()
            msg = None
        elif self.due > now:
            msg = self._schedule(self.due, now)
        else:
            seq = self._next_seq(now)
            self._claim(now, seq, started=False)
            msg = Msg(seq, 0)
        self._reindex()
        return msg

    def cancel(self, now: int) -> int:
        if not self.exists:
            return 0
        # as lodash's cancel(): the next trigger starts a new burst (a leading edge)
        self.last = None
        dropped = self.pending
        if dropped:
            self.cancelled += dropped
            self._close_flight()
            self.attempt = 0
            self.not_before = None
            self._next_seq(now)  # any message out is now stale
            self._untake()
        self._reindex()
        return dropped

    # -- views ----------------------------------------------------------------------------

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
            "anchor": self.anchor if self.pending else None,
            "bound": self.bound if self.pending else None,
            "attempted": self.attempted if self.pending else 0,
            "due": self.due,
            "payload": (self.payload or []) if collect else self.payload,
            "due_fixed": self.due_fixed,
            "attempt": self.attempt,
            "not_before": self.not_before,
            "seq": self.seq,
            "taken": self.taken,
            "taken_at": self.taken_at if self.taken else None,
            "entry": self.entry,
            "run_id": self.run_id,
            "run_seq": self.run_seq if self.running_until is not None else 0,
            "running_until": self.running_until,
            "run_triggers": self.run_triggers,
            "run_payload": (self.run_payload or []) if collect else self.run_payload,
            "run_first": self.run_first,
            "run_attempt": self.run_attempt,
            "run_attempted": self.run_attempted if self.running_until is not None else 0,
            "run_bound": self.run_bound if self.running_until is not None else None,
            "last_run_at": self.last_run_at,
            "triggers": self.triggers,
            "runs": self.runs,
            "merged": self.merged,
            "cancelled": self.cancelled,
        }
