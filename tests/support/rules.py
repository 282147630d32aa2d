"""One key's rules (``django_debounce/machine.py``'s ``KeyModel``) driven directly, with a fake
clock and a ledger of every trigger, checked against invariants I1-I8 of docs/design.md after
every step. No store, no server: the tier of ``tests/unit`` (``test_machine_*.py``).

``KeyLedger`` plays every party a key meets: callers' triggers (on the row path, each with
the options it gives for itself, one mapping ``own`` of ``tests/support/call_options.py``, or
the task's), a Redis **counter** that absorbs plain merges until a step that needs the row
seals it (``fold``) or until Redis forgets it (its triggers never reach the row), the pump's
``take`` (and ``release`` of a refused publish), messages delivered on time, early, twice or
stale, workers' claims (``fire``), finishes (ok, a retry after a backoff, a final failure, a
give-up), crashes (a run that never finishes: its lease runs out), heartbeats and the lease
keeper's extensions, ``flush`` and ``cancel``. The clock is ``now`` (integer microseconds);
only the caller moves it.

The ledger is built from the rules' answers, the way ``tests/stores/test_properties.py``
builds its ledger from a store's, and ``check`` holds the key to:

- I1: every accepted trigger is pending, or covered by a run claimed at or after it that is
  live or finished (a lost or retried run's triggers are pending again); the rules' pending
  count (collect: items) and payload are the ledger's; ``drain`` runs everything left and
  then none is pending. A trigger a forgotten counter absorbed never reaches the row (it is
  not counted) but the flight it joined still runs after it.
- I2: with ``overlap=False`` no claim while another run is live.
- I3: no claim before the due time the last trigger it covers gave the flight (a flush, a
  leading edge and a full batch are due at once), nor before a retry's backoff.
- I5: one claim per flight, one claim per message (a duplicate or stale one drops).
- I6: ``triggers == claimed + pending + cancelled``, ``runs``, ``merged``, ``pending >= 0``.
- I7: a crashed run is lost once an operation that recovers leases sees its lease end.
- I8 (and "never stranded"): a key with pending triggers or a live run has a due index entry,
  never later than the time the key needs attention.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django_debounce.machine import US, Config, KeyModel, Msg, canon
from tests.support.call_options import rules_options

COUNTED = ("live", "ok", "failed", "superseded")  # runs whose triggers count as claimed
FINAL = ("ok", "failed", "superseded")  # runs whose triggers stay claimed


def _dup(obj: Any) -> Any:
    """A shallow copy of a dataclass instance (``copy.copy``, faster)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    return new


@dataclass
class Rec:
    """One trigger: accepted by the row (``pending``, then ``claimed``), absorbed by a counter
    (``counted`` until folded), ``cancelled`` or ``dropped`` (``trailing=False``)."""

    id: int
    at: int
    payload: Any
    due: int | None
    status: str = "pending"
    run: int | None = None
    exempt: bool = False  # flushed, or in a flight due at once (leading edge, full batch)
    attempted: bool = False  # a run that covered it failed or was lost
    forgotten: bool = False  # its counter was forgotten before a fold: the row never saw it
    flight: int | None = None  # the flight a counted trigger joined


@dataclass
class RunT:
    run_id: int
    claim_at: int
    lease_end: int
    triggers: int
    seq: int | None
    worker: str | None  # None: a flush claimed it and its message has not started it yet
    status: str = "live"  # live, ok, failed, retried, lost, superseded, returned
    ended: bool = False  # its worker finished it or died: it calls no more
    crashed: bool = False


@dataclass
class Message:
    seq: int
    due: int


@dataclass
class Counter:
    """A Redis counter: made after a row-path trigger, with that trigger's fingerprint (its
    payload, and its options as the rules resolve them: ``own``, every option named)."""

    flight: int
    payload: Any
    own: dict[str, Any]
    count: int = 0
    last: int = 0


@dataclass
class KeyLedger:
    cfg: Config
    now: int
    retake: int
    direct: int
    model: KeyModel = field(init=False)
    recs: list[Rec] = field(default_factory=list)
    runs: dict[int, RunT] = field(default_factory=dict)
    pool: list[Message] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)  # seqs delivered, newest last
    counter: Counter | None = None
    not_before: int | None = None
    flights: set[int] = field(default_factory=set)
    claimed_by: set[int] = field(default_factory=set)
    touched: int = 0  # time of the last operation that recovers a lost lease
    made: int = 0
    horizon: int = 0  # canonical(): the longest wait or max_wait a trigger may give, or more

    def __post_init__(self) -> None:
        self.model = KeyModel(cfg=self.cfg, retake=self.retake, direct=self.direct)

    # -- plumbing -------------------------------------------------------------------------

    def payload(self, value: Any) -> Any:
        return value if self.cfg.collect else {"args": [value], "kwargs": {}}

    def publish(self, msg: Msg | None) -> None:
        if msg is not None:
            self.pool.append(Message(msg.seq, self.now + msg.countdown))

    def after(self, *, recovers: bool) -> None:
        """Ledger bookkeeping common to every operation at ``now``."""
        model = self.model
        for run_id in model.events:
            run = self.runs[run_id]
            assert run.status == "live", f"run {run_id} lost twice"
            run.status = "lost"
            self._back(run_id)
        model.events.clear()
        for run_id in getattr(model, "returned", ()):
            # a run a flush claimed went back to pending before its message started it: no
            # attempt is counted, its triggers are pending again as they were
            run = self.runs[run_id]
            assert run.status == "live" and run.worker is None, f"run {run_id} returned: {run}"
            run.status = "returned"
            for rec in self.recs:
                if rec.status == "claimed" and rec.run == run_id:
                    rec.status, rec.run, rec.flight = "pending", None, None
        if hasattr(model, "returned"):
            model.returned.clear()
        if recovers:
            self.touched = self.now
        if model.pending and model.due_fixed:
            for rec in self.recs:
                if rec.status == "pending":
                    rec.exempt = True

    def _back(self, run_id: int) -> None:
        for rec in self.recs:
            if rec.status == "claimed" and rec.run == run_id:
                rec.status, rec.run, rec.attempted, rec.flight = "pending", None, True, None

    def settle(self) -> None:
        """A step that decides on the open flight seals the counter first and folds what it
        counted (``KeyModel.fold``); the counter is gone (a tombstone) either way."""
        counter, self.counter = self.counter, None
        if counter is None or not counter.count:
            return
        self.model.fold(counter.count, counter.last, **counter.own)
        for rec in self.recs:
            if rec.status == "counted":
                rec.status = "pending"

    def live_runs(self) -> list[RunT]:
        return [r for r in self.runs.values() if r.status == "live"]

    def open_runs(self, worker: str | None = None) -> list[RunT]:
        """Runs whose worker may still call (finish, heartbeat, extend)."""
        return [
            r
            for r in self.runs.values()
            if not r.ended and r.worker is not None and (worker is None or r.worker == worker)
        ]

    # -- triggers -------------------------------------------------------------------------

    def trigger(
        self, value: Any = 1, own: Mapping[str, Any] | None = None, *, fails: bool = False
    ) -> Msg | None:
        """A trigger on the row path (``own``: the options it gives for itself, in
        microseconds, ``{"wait": 0}``; ``None`` or ``{}``: the task's); a message it asks for
        is published, or, when ``fails``, refused by the broker and released (I8). A trigger
        that leaves a flight open makes a counter with its fingerprint."""
        self.settle()
        payload = self.payload(value)
        options = rules_options(self.model, own or {})
        out, msg = self.model.trigger(self.now, payload, **options)
        self.after(recovers=True)
        self.made += 1
        rec = Rec(self.made, self.now, payload, out.due_at)
        if not out.pending:
            rec.status = "dropped"
        self.recs.append(rec)
        assert out.scheduled == (msg is not None)
        if msg is not None:
            if fails:
                self.release(msg.seq)
            else:
                self.publish(msg)
        if out.pending and not self.cfg.collect:
            self.counter = Counter(self.model.flight_id, payload, options)
        return msg

    def can_count(self) -> bool:
        """Whether the key's counter would absorb a trigger now, as the row path would a plain
        merge (a lease that ran out is left to the row path here)."""
        m = self.model
        return (
            self.counter is not None
            and m.pending > 0
            and self.counter.flight == m.flight_id
            and (m.running_until is None or m.running_until > self.now)
            and self._probe()[0].merged
        )

    def _probe(self) -> tuple[Any, Msg | None]:
        """What the row path would make of a trigger with the counter's fingerprint now.
        Fence 5 says a plain merge; after a retry or a lost run whose triggers rejoined the
        flight with an earlier anchor it may not be (``test_machine_exhaustive``'s
        ``test_a_counter_absorbs_only_what_the_row_would_merge``): the counter's triggers
        here are limited to plain merges, so that the search goes on past that gap."""
        counter = self.counter
        assert counter is not None
        probe = _dup(self.model)
        probe.events = []
        if hasattr(probe, "returned"):
            probe.returned = []
        return probe.trigger(self.now, counter.payload, **counter.own)

    def count(self) -> None:
        """A trigger the counter absorbs (its fingerprint: the payload and options of the
        row-path trigger that made it). Fence 5: the row path would have taken it as a
        plain merge, so its due time is that merge's."""
        counter = self.counter
        assert counter is not None and self.can_count()
        out, msg = self._probe()
        assert out.merged and msg is None, (
            f"fence 5: a trigger with the counter's fingerprint is no plain merge: {out}"
        )
        counter.count += 1
        counter.last = self.now
        self.made += 1
        self.recs.append(
            Rec(self.made, self.now, counter.payload, out.due_at, "counted", flight=counter.flight)
        )

    def forget(self) -> None:
        """Redis forgets the counter: what it counted never reaches the row."""
        self.counter = None
        for rec in self.recs:
            if rec.status == "counted":
                rec.status, rec.forgotten = "pending", True

    # -- the pump and messages -------------------------------------------------------------

    def take(self, *, fails: bool = False) -> Msg | None:
        """The pump takes the key's entry when it is due; a refused publish is released."""
        m = self.model
        if m.entry is None or m.entry > self.now:
            return None
        self.settle()
        msg, _again = m.take(self.now)
        self.after(recovers=True)
        if msg is not None:
            assert msg.countdown == 0
            if fails:
                self.release(msg.seq)
            else:
                self.publish(msg)
        return msg

    def release(self, seq: int) -> None:
        self.model.release(self.now, seq)
        self.after(recovers=False)

    def deliver(self, index: int, worker: str = "A", *, keep: bool = False) -> str:
        """Worker ``worker`` gets message ``index`` of the pool now (early, on time or late;
        ``keep``: it stays in the pool, to arrive again)."""
        msg = self.pool[index]
        if not keep:
            del self.pool[index]
        return self.fire(msg.seq, worker)

    def fire(self, seq: int | None, worker: str = "A") -> str:
        self.settle()
        if seq is not None:
            self.delivered.append(seq)
        out = self.model.fire(self.now, seq)
        self.after(recovers=True)
        if out.action == "missing":
            return out.action
        self.publish(out.dispatch)
        if getattr(out, "flushed", False):
            # the message of a flush starts the run the flush claimed (counted then)
            assert out.claim is not None and seq is not None
            run = self.runs[out.claim.run_id]
            assert run.status == "live" and run.worker is None and run.seq == seq, run
            run.worker = worker
            run.lease_end = self.now + self.cfg.lease
            assert self.model.running_until == run.lease_end
        elif out.claim is not None:
            self._claimed(out.claim, seq, worker)
        return out.action

    def _claimed(self, claim: Any, seq: int | None, worker: str | None) -> None:
        cfg, now = self.cfg, self.now
        # I5: one claim per flight, one claim per delivered message
        assert claim.flight_id not in self.flights, f"I5: flight {claim.flight_id} claimed twice"
        self.flights.add(claim.flight_id)
        if seq is not None:
            assert seq not in self.claimed_by, f"I5: message {seq} claimed twice"
            self.claimed_by.add(seq)
        # I2: no two live runs without overlap (a lost run is not live)
        still_live = self.live_runs()
        if not cfg.overlap:
            assert not still_live, f"I2: run {claim.run_id} claimed while {still_live} is live"
        for run in still_live:
            run.status = "superseded"  # overlap: the rules follow only the newest run
        pending = [r for r in self.recs if r.status == "pending"]
        if cfg.collect:
            items = {canon(i) for i in claim.payload}
            covered = [r for r in pending if canon(r.payload) in items]
            backed = {canon(r.payload) for r in covered}
            assert items == backed, f"I1: claimed items {items - backed} of no trigger"
        else:
            covered = pending
            row = [r for r in covered if not r.forgotten]
            assert len(row) == claim.triggers, f"I6: claim of {claim.triggers}, {row}"
            newest = max(row, key=lambda r: r.id)
            assert claim.payload == newest.payload, "the run does not get the last payload"
        # I3: not before the due time its last trigger gave the flight, nor a backoff's end
        # (a forgotten trigger never moved the row's due time: the window may end early)
        last = max(
            (r for r in covered if not r.forgotten), key=lambda r: (r.at, r.id), default=None
        )
        assert last is None or last.exempt or last.due is None or now >= last.due, (
            f"I3: claim at {now} before due {last.due} of its last trigger {last.id}"
        )
        for rec in covered:
            assert now >= rec.at, f"I1: trigger {rec.id} at {rec.at} covered by a claim at {now}"
            if rec.forgotten and rec.flight is not None:
                assert rec.flight == claim.flight_id, (
                    f"forgotten trigger {rec.id} joined flight {rec.flight}, "
                    f"flight {claim.flight_id} ran"
                )
            rec.status, rec.run = "claimed", claim.run_id
        assert self.not_before is None or now >= self.not_before, "I3: claim before the backoff"
        self.not_before = None
        assert claim.due_at is None or now >= claim.due_at
        assert self.model.running_until is not None
        self.runs[claim.run_id] = RunT(
            claim.run_id, now, self.model.running_until, claim.triggers, seq, worker
        )

    # -- runs -----------------------------------------------------------------------------

    def finish(self, run: RunT, outcome: str, retry_in: int = 0, *, fails: bool = False) -> None:
        """``run``'s worker ends it: ``ok``, ``retry`` (after ``retry_in``), ``fail`` (final),
        or ``give_up`` (its attempts ran out: only its triggers an attempt covered fail)."""
        model, cfg, now = self.model, self.cfg, self.now
        assert not run.ended
        run.ended = True
        applies = (
            model.current(run.run_id)
            and model.running_until is not None
            and model.running_until > now
        )
        ok, give_up = outcome == "ok", outcome == "give_up"
        retry = retry_in if outcome == "retry" else None
        back_items: set[str] | None = None
        covered = 0
        if applies and give_up and 0 < model.run_attempted < model._run_size():
            if cfg.collect:
                back_list = (model.run_payload or [])[model.run_attempted :]
                back_items = {canon(i) for i in back_list}
                covered = model.run_triggers - len(back_list)
            else:
                back_items = set()
                covered = model.run_attempted
                claimed = [
                    r
                    for r in self.recs
                    if r.status == "claimed" and r.run == run.run_id and not r.forgotten
                ]
                attempted = sum(1 for r in claimed if r.attempted)
                assert attempted == model.run_attempted, (
                    f"attempted triggers: ledger {attempted}, model {model.run_attempted}"
                )
        msg = model.finish(now, run.run_id, ok=ok, retry_in=retry, give_up=give_up)
        self.after(recovers=True)
        if msg is not None:
            if fails:
                self.release(msg.seq)
            else:
                self.publish(msg)
        if not applies:
            return
        assert run.status == "live"
        if outcome == "retry":
            run.status = "retried"
            self._back(run.run_id)
            self.not_before = now + retry_in
        else:
            run.status = "ok" if ok else "failed"
        if back_items is not None:
            for rec in self.recs:
                if rec.status != "claimed" or rec.run != run.run_id:
                    continue
                if cfg.collect:
                    goes = canon(rec.payload) in back_items
                else:
                    goes = not rec.attempted
                if goes:
                    rec.status, rec.run, rec.exempt = "pending", None, True
            run.triggers = covered

    def crash(self, run: RunT) -> None:
        """``run``'s worker dies: it never finishes nor heartbeats; its lease runs out."""
        run.ended = run.crashed = True

    def heartbeat(self, run: RunT) -> bool:
        ok = self.model.heartbeat(self.now, run.run_id, self.cfg.lease)
        if ok:
            run.lease_end = self.now + self.cfg.lease
        return ok

    def extend(self, run: RunT) -> int | None:
        if run.seq is None:
            return None
        end = self.model.extend(self.now, run.seq, self.cfg.lease)
        if end is not None:
            run.lease_end = end
        return end

    # -- operators ------------------------------------------------------------------------

    def flush(self, *, fails: bool = False) -> Msg | None:
        """A flush: the flight is due now (no backoff); it may claim the flight itself (a run
        that its message starts, or that goes back to pending when the message does not come
        within ``retake``); ``fails``: that message is refused and released."""
        self.settle()
        model = self.model
        known = model.run_id
        msg = model.flush(self.now)
        # the rules whose flush claims (``KeyModel.returned``) recover a lost lease first
        self.after(recovers=hasattr(model, "returned"))
        if model.pending or model.run_id != known:
            for rec in self.recs:
                if rec.status == "pending":
                    rec.exempt = True
            self.not_before = None
        if model.run_id != known:
            # the flush claimed the flight: a run its message starts
            assert msg is not None and model.running_until is not None
            assert model.run_seq == msg.seq
            self._claimed(model.run_claim(), msg.seq, None)
        if msg is not None:
            if fails:
                self.release(msg.seq)
            else:
                self.publish(msg)
        return msg

    def cancel(self) -> int:
        self.settle()
        dropped = self.model.cancel(self.now)
        if dropped:
            for rec in self.recs:
                if rec.status == "pending":
                    rec.status = "cancelled"
            self.not_before = None
        self.after(recovers=False)
        return dropped

    # -- invariants -----------------------------------------------------------------------

    def check(self) -> None:
        model = self.model
        row = [r for r in self.recs if not r.forgotten and r.status != "counted"]
        counted = [r for r in self.runs.values() if r.status in COUNTED]
        # I6 bookkeeping
        assert model.pending >= 0
        assert model.triggers == len(row), f"I6: {model.triggers} counted, {len(row)} made"
        assert model.triggers == (
            sum(r.triggers for r in counted) + model.pending + model.cancelled
        ), f"I6: {model.live_state()} vs runs {counted}"
        assert model.runs == len(counted), f"I6: runs {model.runs}, ledger {len(counted)}"
        assert model.merged == sum(r.triggers - 1 for r in counted), "I6: merged"
        # I1 nothing lost
        pending = [r for r in row if r.status == "pending"]
        for rec in self.recs:
            assert rec.status in ("pending", "counted", "claimed", "cancelled", "dropped")
            if rec.status == "claimed":
                assert rec.run is not None
                run = self.runs[rec.run]
                assert run.status in COUNTED, f"I1: trigger {rec.id} is left with run {run}"
                assert run.claim_at >= rec.at
        if self.cfg.collect:
            want = {canon(r.payload) for r in pending}
            got = {canon(i) for i in (model.payload or [])}
            assert want == got, f"I1: pending items {got}, pending triggers {want}"
        else:
            assert len(pending) == model.pending, f"I1: {len(pending)} vs {model.pending}"
            cancelled = [r for r in row if r.status in ("cancelled", "dropped")]
            assert len(cancelled) == model.cancelled
            if pending:
                newest = max(pending, key=lambda r: r.id)
                assert model.payload == newest.payload, "the flight lost its last payload"
        # I7 crash safety: a crashed run is lost once an operation sees its lease ran out
        for run in self.runs.values():
            if run.crashed and run.status == "live":
                assert run.lease_end > self.touched, f"I7: run {run} outlived its lease"
        # I2: at most one live run without overlap; the rules' live run is the ledger's
        live = self.live_runs()
        assert len(live) <= 1 or self.cfg.overlap, f"I2: live runs {live}"
        if model.running_until is not None:
            assert [r.run_id for r in live] == [model.run_id], f"live {live}, {model.run_id}"
            assert live[0].lease_end == model.running_until
        else:
            assert not live, f"live runs {live}, the rules have none"
        # I8: never stranded: an entry whenever the key needs attention, never later
        need = model._attention()
        if model.pending or model.running_until is not None:
            assert need is not None, "pending or running, and no attention time"
        if need is not None:
            assert model.entry is not None and model.entry <= need, (
                f"I8: entry {model.entry}, the key needs attention at {need}"
            )

    # -- the end --------------------------------------------------------------------------

    def drain(self, rounds: int = 200, *, checks: bool = True) -> None:
        """Run everything left: open runs finish ok, messages arrive on time, the pump takes
        each entry at its time; then nothing is pending and every trigger was covered.
        ``checks=False``: ``check`` only at the end (every claim is still checked)."""
        for _round in range(rounds):
            opened = self.open_runs()
            if opened:
                self.finish(opened[0], "ok")
            elif self.pool:
                first = min(range(len(self.pool)), key=lambda i: self.pool[i].due)
                self.now = max(self.now, self.pool[first].due)
                self.deliver(first)
            else:
                entry = self.model.entry
                if entry is None:
                    break
                self.now = max(self.now, entry)
                self.take()
            if checks:
                self.check()
        else:
            raise AssertionError("the key did not become idle")
        self.check()
        left = [r for r in self.recs if r.status in ("pending", "counted")]
        assert not left, f"I1: triggers never covered: {left}"
        model = self.model
        assert not model.pending and model.running_until is None and model.entry is None

    # -- a canonical form (the exhaustive search) -------------------------------------------

    def clone(self) -> KeyLedger:
        """A copy to step on (faster than ``deepcopy``: payloads are never changed in place,
        by the rules or the ledger; a trigger that no step can change again is shared)."""
        other = _dup(self)
        model = other.model = _dup(self.model)
        model.events = list(self.model.events)
        if hasattr(model, "returned"):
            model.returned = list(self.model.returned)
        runs = self.runs
        other.recs = [
            r
            if r.status in ("cancelled", "dropped")
            or (r.status == "claimed" and runs[r.run].status in FINAL)  # type: ignore[index]
            else _dup(r)
            for r in self.recs
        ]
        other.runs = {k: r if r.status in FINAL and r.ended else _dup(r) for k, r in runs.items()}
        other.pool = list(self.pool)
        other.delivered = list(self.delivered)
        other.counter = None if self.counter is None else _dup(self.counter)
        other.flights = set(self.flights)
        other.claimed_by = set(self.claimed_by)
        return other

    def canonical(self) -> tuple[Any, ...]:
        """The state up to what no later step can tell apart, for the exhaustive search:

        - every time relative to ``now``; the key's last trigger, last claim, first triggers
          and the runs' claim times, once further back than ``horizon`` (set it to the
          longest ``wait``/``max_wait`` a trigger can give, or more), as that far back: the
          rules only compare them with ``now`` minus a wait or a ``max_wait``, or report them;
        - each sequence as the current one or an older one (only equality with the current
          one decides), and the current one relative to ``now`` while not in the past;
        - run ids relative to the rules' last one; whether the open flight was claimed;
        - the ledger's triggers by group (pending, counted, claimed by a run still live or
          open), each group as its counts and its latest trigger's time, due time and
          exemption (a claim checks only these), and the finished history as differences
          of the ledger's counts from the rules' totals (zero while I6 holds).

        Not kept: which triggers an attempt covered (only a give-up reads them, and no step of
        the search gives up).
        """
        m, now = self.model, self.now
        horizon = self.horizon

        def t(value: int | None) -> int | None:
            return None if value is None else value - now

        def old(value: int | None) -> int | None:
            if value is None:
                return None
            return max(value - now, -horizon) if horizon else value - now

        def s(seq: int | None) -> Any:
            if seq is None:
                return None
            return "cur" if seq == m.seq else "old"

        live = m.running_until is not None
        state = (
            m.exists,
            m.pending,
            old(m.first),
            old(m.last),
            t(m.anchor) if m.pending else None,
            t(m.bound) if m.pending else None,
            m.attempted if m.pending else 0,
            t(m.due),
            repr(m.payload),
            m.due_fixed,
            m.attempt,
            t(m.not_before),
            t(m.seq) if m.seq >= now else "past",
            m.taken,
            t(m.taken_at) if m.taken else None,
            t(m.entry),
            s(m.run_seq or None) if live else None,
            t(m.running_until),
            m.run_triggers if live else 0,
            repr(m.run_payload) if live else None,
            old(m.run_first) if live else None,
            t(m.run_anchor) if live else None,
            t(m.run_bound) if live else None,
            m.run_attempt if live else 0,
            m.run_attempted if live else 0,
            getattr(m, "run_started", True),
            old(m.last_run_at),
            m.flight_id in self.flights,
        )
        groups: dict[Any, list[Any]] = {}
        for r in self.recs:
            if r.status in ("pending", "counted"):
                group: Any = r.status
            elif r.status == "claimed" and r.run is not None:
                run = self.runs[r.run]
                if run.status != "live" and run.ended:
                    continue
                group = r.run - m.run_id
            else:
                continue
            g = groups.setdefault(group, [0, 0, 0, None])
            if r.forgotten:
                joined = r.flight is not None and r.flight == m.flight_id
                g[1 + joined] += 1
                continue
            g[0] += 1
            if g[3] is None or (r.at, r.id) > g[3][0]:
                g[3] = ((r.at, r.id), (t(r.at), t(r.due), r.exempt, repr(r.payload)))
        recs = tuple(
            sorted(
                ((str(k), g[0], g[1], g[2], g[3] and g[3][1]) for k, g in groups.items()),
            )
        )
        counted = [r for r in self.runs.values() if r.status in COUNTED]
        row = [r for r in self.recs if not r.forgotten and r.status != "counted"]
        totals = (
            m.triggers - len(row),
            m.runs - len(counted),
            m.merged - sum(r.triggers - 1 for r in counted),
            m.cancelled - len([r for r in row if r.status in ("cancelled", "dropped")]),
        )
        # workers are interchangeable: named by their first run still followed
        names: dict[str | None, int] = {None: -1}
        kept = sorted(
            (r for r in self.runs.values() if r.status == "live" or not r.ended),
            key=lambda r: r.run_id,
        )
        for r in kept:
            names.setdefault(r.worker, len(names) - 1)
        runs = tuple(
            (
                r.run_id - m.run_id,
                r.status,
                old(r.claim_at),
                t(r.lease_end),
                r.triggers,
                s(r.seq),
                names[r.worker],
                r.ended,
                r.crashed,
            )
            for r in kept
        )
        pool = tuple((s(msg.seq), t(msg.due)) for msg in self.pool)
        counter = (
            None
            if self.counter is None
            else (
                self.counter.flight == m.flight_id,
                repr(self.counter.payload),
                *self.counter.own.values(),
                self.counter.count,
                t(self.counter.last) if self.counter.count else None,
            )
        )
        crashed = any(r.crashed and r.status == "live" for r in self.runs.values())
        return (
            state,
            recs,
            totals,
            runs,
            pool,
            s(self.delivered[-1]) if self.delivered else None,
            m.seq in self.claimed_by,
            counter,
            t(self.not_before),
            t(self.touched) if crashed else None,
        )


__all__ = ["US", "Config", "Counter", "KeyLedger", "Message", "Rec", "RunT"]
