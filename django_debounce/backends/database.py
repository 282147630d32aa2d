"""The database store: a key's ``DebounceKey`` row is its record (docs/design.md, "One record
per key"). Every step is one transaction that locks the row, applies the rules of
``machine.py`` to it and writes the result back (``rows.py``); the due index is the
``DebounceDue`` table, taken by the pump with ``SELECT ... FOR UPDATE SKIP LOCKED``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import DatabaseError, router, transaction

from django_debounce import conf
from django_debounce.backends.base import BaseBackend, LiveRun, Taken
from django_debounce.backends.rows import Record, Rows, config, to_dt, to_us
from django_debounce.machine import US, ClaimOut, Msg
from django_debounce.models import DebounceDue, DebounceKey, DebounceRun
from django_debounce.state import (
    Claim,
    Dispatch,
    FireAction,
    FireDecision,
    FlightOptions,
    IndexStats,
    TriggerResult,
)

# DebounceRun.Outcome's values
RUNNING, SUCCESS, FAILURE, RETRY = "running", "success", "failure", "retry"


class DatabaseBackend(BaseBackend):
    """The row-lock store (``DEBOUNCE_BACKEND = "database"``) on PostgreSQL or SQLite."""

    name = "database"
    MANY = 500  # triggers per transaction of trigger_many

    @property
    def alias(self) -> str:
        return router.db_for_write(DebounceKey) or "default"

    def rows(self) -> Rows:
        """The records, with the dispatch grace and the pump interval of the settings."""
        retake = int(round(conf.seconds_of("DISPATCH_GRACE") * US))
        direct = int(round(conf.seconds_of("PUMP_INTERVAL") * US))
        return Rows(self.alias, retake, direct)

    # -- hooks of the Redis store (counters over these rows) -----------------------------------

    def settle(
        self, rows: Rows, records: Sequence[Record], now: int, *, mode: str = "claim"
    ) -> None:
        """Make each record's open flight whole before a step decides on it (``mode``: the
        step is a ``"trigger"``, a ``"claim"`` or a ``"cancel"``). The database store holds
        every trigger in its rows already."""

    # -- triggers ------------------------------------------------------------------------------

    def _dispatch(self, record: Record, msg: Msg | None) -> Dispatch | None:
        if msg is None:
            return None
        return Dispatch(
            record.key_hash,
            msg.seq,
            msg.countdown / US,
            record.task_name,
            record.key_text,
        )

    def _apply_trigger(
        self, record: Record, now: int, payload: Any
    ) -> tuple[TriggerResult, Dispatch | None, bool]:
        """One trigger on a locked record: its result, its message, and whether it was a
        plain merge (which leaves the index entry)."""
        out, msg = record.key.trigger(now, payload)
        merge = out.merged
        if out.pending == 0:
            dropped = TriggerResult(record.key_text, out.flight_id, 0, None, False, dropped=True)
            return dropped, None, merge
        dispatch = self._dispatch(record, msg)
        result = TriggerResult(
            record.key_text, out.flight_id, out.pending, to_dt(out.due_at), dispatch is not None
        )
        return result, dispatch, merge

    def trigger(self, *, task_name, key, key_hash, payload_json, options, now=None):
        return self.row_trigger(task_name, key, key_hash, payload_json, options, now, None)

    def row_trigger(
        self,
        task_name: str,
        key: str,
        key_hash: str,
        payload_json: str,
        options: FlightOptions,
        now: datetime | None,
        context: Any,
    ) -> tuple[TriggerResult, Dispatch | None]:
        """``trigger`` on the row (``context`` goes to ``opened``)."""
        rows = self.rows()
        cfg = config(options)
        payload = json.loads(payload_json)
        for _again in range(3):
            with rows.step():
                record, at = rows.lock_at(key_hash, cfg, now)
                record = record or rows.blank(key_hash, key, task_name, cfg)
                self.settle(rows, [record], at, mode="trigger")
                result, dispatch, merge = self._apply_trigger(record, at, payload)
                self.opened(rows, [record], at, context)
                written = rows.write(record, at, reindex=not merge)
            if written:
                self.after_commit([record])
                return result, dispatch
            # another transaction made the row meanwhile: take the step again, on it
        raise DatabaseError(
            "the row of this trigger's key was made and deleted by other transactions "
            "meanwhile, three times; nothing was counted: send it again"
        )

    def trigger_many(self, *, task_name, items, options, now=None):
        return self.row_triggers(task_name, items, options, now, None)

    def row_triggers(
        self,
        task_name: str,
        items: Sequence[tuple[str, str, str]],
        options: FlightOptions,
        now: datetime | None,
        context: Any,
    ) -> list[tuple[TriggerResult, Dispatch | None]]:
        """``trigger_many`` on the rows: one transaction per ``MANY`` items, the missing rows
        made in one statement, every row locked in key-hash order (concurrent batches never
        deadlock), each trigger applied in order. ``context`` goes to ``opened``."""
        rows = self.rows()
        cfg = config(options)
        out: list[tuple[TriggerResult, Dispatch | None]] = []
        for start in range(0, len(items), self.MANY):
            chunk = items[start : start + self.MANY]
            keys = dict(sorted({hashed: key for key, hashed, _p in chunk}.items()))
            for make_first in (False, True):
                done, held = self._triggers_once(
                    rows, chunk, keys, task_name, cfg, now, context, make_first
                )
                if done is not None:
                    break
                if make_first:  # made and deleted again meanwhile (a purge): nothing counted
                    raise DatabaseError(
                        "rows of this trigger_many batch were made and deleted by other "
                        "transactions meanwhile; nothing of the batch was counted: send it again"
                    )
            assert done is not None
            out += done
            self.after_commit(list(held.values()))
        return out

    def _triggers_once(
        self,
        rows: Rows,
        chunk: Sequence[tuple[str, str, str]],
        keys: dict[str, str],
        task_name: str,
        cfg: Any,
        now: datetime | None,
        context: Any,
        make_first: bool = False,
    ) -> tuple[list[tuple[TriggerResult, Dispatch | None]] | None, dict[str, Record]]:
        """One transaction of ``row_triggers``. The keys without a row are taken first and
        their rows inserted whole, before any counter is sealed: when another transaction
        made one of them meanwhile, the transaction rolls back having changed nothing
        anywhere (``None``: take the batch again with ``make_first``, every row made before
        it is locked). Then the other keys, each sealed and folded, then written."""
        done: list[Any] = [None] * len(chunk)
        reindex: set[str] = set()

        def apply(records: dict[str, Record], at: int) -> None:
            for i, (_key, hashed, payload_json) in enumerate(chunk):
                if hashed in records:
                    result, dispatch, merge = self._apply_trigger(
                        records[hashed], at, json.loads(payload_json)
                    )
                    if not merge:
                        reindex.add(hashed)
                    done[i] = (result, dispatch)

        with rows.atomic():
            at = rows.clock(now)
            if make_first:
                rows.create(list(keys.items()), task_name, cfg.overlap)
            held = rows.lock_many(list(keys), {task_name: cfg})
            new = {h: rows.blank(h, k, task_name, cfg) for h, k in keys.items() if h not in held}
            if new:
                apply(new, at)
                self.opened(rows, list(new.values()), at, context)
                if not rows.write_many([(r, h in reindex) for h, r in new.items()], at):
                    transaction.set_rollback(True, using=rows.alias)
                    return None, {}
            self.settle(rows, list(held.values()), at, mode="trigger")
            apply(held, at)
            self.opened(rows, list(held.values()), at, context)
            rows.write_many([(r, h in reindex) for h, r in held.items()], at)
        return done, {**held, **new}

    def opened(self, rows: Rows, records: Sequence[Record], now: int, context: Any) -> None:
        """After a trigger on the row path, before its commit (the Redis store writes the
        fence of the counter it will make)."""

    def after_commit(self, records: Sequence[Record]) -> None:
        """After a trigger's transaction committed (the Redis store makes its counters)."""

    # -- the pump ------------------------------------------------------------------------------

    def _entries(self, task_names: Sequence[str] | None) -> Any:
        qs = DebounceDue.objects.using(self.alias)
        return qs if task_names is None else qs.filter(task_name__in=list(task_names))

    def peek(self, task_names, *, now=None):
        if task_names is not None and not task_names:
            return None
        got = self._entries(task_names).order_by("due_at").values_list("due_at", flat=True).first()
        if got is None:
            return None
        return (to_us(got) - self.rows().clock(now)) / US  # type: ignore[operator]

    def take(self, tasks, limit, *, now=None):
        if tasks is None:
            raise TypeError("take() needs the tasks it may take entries of")
        names = sorted(tasks)
        if not names or limit <= 0:
            return Taken(next_in=self.peek(names, now=now) if names else None)
        rows = self.rows()
        cfgs = {name: config(options) for name, options in tasks.items()}
        dispatches: list[Dispatch] = []
        again = 0
        with rows.atomic():
            at = rows.clock(now)
            due = (
                self._entries(names)
                .select_for_update(skip_locked=True)
                .filter(due_at__lte=to_dt(at))
                .order_by("due_at")
                .values_list("key_hash", flat=True)[:limit]
            )
            hashes = list(due)
            held = rows.lock_many(hashes, cfgs, skip_locked=True)
            gone = set(hashes) - set(held)
            if gone:  # entries of rows purged meanwhile (rows locked by others stay)
                gone -= set(
                    DebounceKey.objects.using(self.alias)
                    .filter(key_hash__in=gone)
                    .values_list("key_hash", flat=True)
                )
                DebounceDue.objects.using(self.alias).filter(key_hash__in=gone).delete()
            records = [r for r in held.values() if r.entry is not None and r.entry <= at]
            self.settle(rows, records, at)
            for record in records:
                msg, retaken = record.key.take(at)
                again += retaken
                dispatch = self._dispatch(record, msg)
                if dispatch is not None:
                    dispatches.append(dispatch)
            rows.write_many([(r, True) for r in records], at)
            left = self._entries(names).order_by("due_at").values_list("due_at", flat=True).first()
        next_in = None if left is None else (to_us(left) - at) / US  # type: ignore[operator]
        return Taken(dispatches, again, next_in)

    def release(self, dispatches, *, now=None):
        rows = self.rows()
        with rows.atomic():
            at = rows.clock(now)
            for dispatch in sorted(dispatches, key=lambda d: d.key_hash):  # one lock order
                record = rows.lock(dispatch.key_hash, None)
                if record is not None and record.key.release(at, dispatch.seq):
                    rows.write(record, at)

    # -- the worker ----------------------------------------------------------------------------

    def _run_row(self, record: Record, claim: ClaimOut, at: int) -> None:
        """The ``DebounceRun`` row of a claim, written in the claim's transaction."""
        last = claim.last_trigger_at if claim.last_trigger_at is not None else at
        first = claim.first_trigger_at if claim.first_trigger_at is not None else last
        due = claim.due_at if claim.due_at is not None else at
        record.new_runs.append(
            {
                "task_name": record.task_name,
                "flight_id": claim.flight_id,
                "run_id": claim.run_id,
                "attempt": claim.attempt,
                "triggers": claim.triggers,
                "first_trigger_at": to_dt(first),
                "last_trigger_at": to_dt(last),
                "due_at": to_dt(due),
                "started_at": to_dt(at),
                "delay": max(at - last, 0) / US,
                "outcome": RUNNING,
                "error": "",
            }
        )

    def fire(self, key_hash, seq, *, task_name, options, now=None):
        rows = self.rows()
        with rows.step():
            record, at = rows.lock_at(key_hash, config(options), now)
            if record is None:
                return FireDecision(FireAction.MISSING)
            self.settle(rows, [record], at)
            k = record.key
            out = k.fire(at, seq)
            claim = out.claim
            if claim is not None and not out.flushed:  # a flush wrote its run's row
                self._run_row(record, claim, at)
            rows.write(record, at)
        dispatch = self._dispatch(record, out.dispatch)
        if claim is None:
            return FireDecision(FireAction(out.action), dispatch=dispatch)
        started = claim.started_at
        last = claim.last_trigger_at if claim.last_trigger_at is not None else started
        first = claim.first_trigger_at if claim.first_trigger_at is not None else last
        due = claim.due_at if claim.due_at is not None else started
        return FireDecision(
            FireAction.CLAIM,
            dispatch=dispatch,
            claim=Claim(
                key_hash=key_hash,
                key=record.key_text,
                task_name=record.task_name,
                run_id=claim.run_id,
                flight_id=claim.flight_id,
                triggers=claim.triggers,
                payload=claim.payload,
                first_trigger_at=to_dt(first),  # type: ignore[arg-type]
                last_trigger_at=to_dt(last),  # type: ignore[arg-type]
                due_at=to_dt(due),  # type: ignore[arg-type]
                started_at=to_dt(started),  # type: ignore[arg-type]
                attempt=claim.attempt,
                attempted=k.run_attempted,
            ),
        )

    def finish(self, key_hash, run_id, end, *, task_name, options, now=None):
        if end.ok:
            outcome = SUCCESS
        elif end.retry_in is not None:
            outcome = RETRY
        else:
            outcome = FAILURE
        retry = None if end.ok or end.retry_in is None else int(round(max(end.retry_in, 0) * US))
        rows = self.rows()
        with rows.step():
            record, at = rows.lock_at(key_hash, config(options), now)
            if record is None:
                return None
            # a retried, given-up or lost run's triggers rejoin the open flight and may bound it
            # earlier: a counter made before must not merge into it any more (fence 5)
            self.settle(rows, [record], at, mode="trigger")
            k = record.key
            started = to_us(end.started_at) if end.started_at is not None else None
            # the finish of another run with this id (a key purged and made again) changes
            # nothing, as a late finisher's
            other = k.current(run_id) and started is not None and k.last_run_at != started
            live = k.current(run_id) and k.running_until is not None and k.running_until > at
            covered = None
            if live and not other and end.give_up and 0 < k.run_attempted < k._run_size():
                back = (
                    len(k.run_payload or []) - k.run_attempted
                    if k.cfg.collect
                    else k.run_triggers - k.run_attempted
                )
                covered = k.run_triggers - back
            msg = k.finish(
                at, -1 if other else run_id, ok=end.ok, retry_in=retry, give_up=end.give_up
            )
            if live and not other:
                record.last_outcome = outcome
            if run_id not in k.events and not other:
                record.ended.append((run_id, outcome, end.error))
            if covered is not None:  # a give-up covers only the attempted triggers
                DebounceRun.objects.using(self.alias).filter(
                    debounce_key_id=record.pk, run_id=run_id
                ).update(triggers=covered)
            rows.write(record, at)
        return self._dispatch(record, msg)

    def heartbeat(self, key_hash, run_id, lease, *, task_name, options, now=None):
        rows = self.rows()
        with rows.step():
            record, at = rows.lock_at(key_hash, config(options), now)
            if record is None or not record.key.heartbeat(at, run_id, int(round(lease * US))):
                return False
            rows.write(record, at)
        return True

    def extend(self, runs, *, now=None):
        if not runs:
            return []
        rows = self.rows()
        results: list[float | None] = [None] * len(runs)
        order = sorted(range(len(runs)), key=lambda i: (runs[i].key_hash, runs[i].seq))
        with rows.atomic():
            at = rows.clock(now)
            for i in order:
                live: LiveRun = runs[i]
                record = rows.lock(live.key_hash, config(live.options))
                if record is None:
                    continue
                until = record.key.extend(at, live.seq, int(round(live.lease * US)))
                if until is not None:
                    results[i] = (until - at) / US
                    rows.write(record, at)
        return results

    # -- operators -----------------------------------------------------------------------------

    def flush(self, key_hash, *, task_name, options, now=None):
        rows = self.rows()
        with rows.atomic():
            record, at = rows.lock_at(key_hash, config(options), now)
            if record is None:
                return None
            self.settle(rows, [record], at)
            k = record.key
            before = k.run_id
            # a counter that could not be sealed may count triggers of the flight until its
            # fence: the flight is due then (fence 4), and claimed by the message then due
            msg = k.flush(at, hold=record.counter_until)
            if k.run_id != before:  # the flush claimed the flight
                self._run_row(record, k.run_claim(), at)
            rows.write(record, at)
        return self._dispatch(record, msg)

    def cancel(self, key_hash, *, task_name, options, now=None):
        rows = self.rows()
        with rows.atomic():
            record, at = rows.lock_at(key_hash, config(options), now)
            if record is None:
                return 0
            self.settle(rows, [record], at, mode="cancel")
            dropped = record.key.cancel(at)
            rows.write(record, at)
        return dropped

    def due_keys(self, now=None, task_names=None):
        rows = self.rows()
        qs = DebounceKey.objects.using(self.alias).filter(
            pending__gt=0, due_at__lte=to_dt(rows.clock(now))
        )
        if task_names is not None:
            qs = qs.filter(task_name__in=list(task_names))
        return list(qs.order_by("due_at").values_list("task_name", "key_hash"))

    # -- reading -------------------------------------------------------------------------------

    STATUS = (
        "state",
        "pending",
        "flight_id",
        "first_trigger_at",
        "last_trigger_at",
        "due_at",
        "running_until",
        "triggers",
        "runs",
        "merged",
        "cancelled",
        "last_run_at",
        "last_outcome",
    )

    def live_state(self, key_hash):
        rows = self.live_rows([key_hash])
        if key_hash not in rows:
            return None
        row = rows[key_hash]
        out = {
            f: row[f]
            for f in ("pending", "flight_id", "triggers", "runs", "merged", "cancelled", "state")
        }
        out["seq"] = row["scheduled_seq"]
        return out

    def live_rows(self, key_hashes):
        if not key_hashes:
            return {}
        qs = DebounceKey.objects.using(self.alias).filter(key_hash__in=list(key_hashes))
        return {
            row["key_hash"]: row for row in qs.values("key_hash", "scheduled_seq", *self.STATUS)
        }

    def pending_counts(self, key_hashes):
        return {h: row["pending"] for h, row in self.live_rows(key_hashes).items()}

    def index_stats(self, task_names=None):
        from django.db.models import Count, Min, Q

        at = self.rows().clock(None)
        qs = (
            self._entries(task_names)
            .values("task_name")
            .annotate(
                depth=Count("key_hash"),
                due=Count("key_hash", filter=Q(due_at__lte=to_dt(at))),
                first=Min("due_at"),
            )
        )
        out = {name: IndexStats(depth=0, due=0, oldest_due_age=0.0) for name in (task_names or [])}
        for row in qs:
            first = to_us(row["first"])
            age = max(at - first, 0) / US if first is not None and first <= at else 0.0
            out[row["task_name"]] = IndexStats(
                depth=row["depth"], due=row["due"], oldest_due_age=age
            )
        return out
