"""The database store: the ``DebounceKey`` row is the state, changed under a row lock.

Each operation runs in ``transaction.atomic(using=router.db_for_write(DebounceKey))``:
an ``INSERT ... ON CONFLICT DO NOTHING`` makes sure the row exists (so the first trigger of
a key from several processes at once makes one row and no IntegrityError), then
``select_for_update()`` locks it. SQLite has no row locks: there the insert is the first
statement of the transaction, which takes SQLite's write lock at once and waits for it with
the connection's busy timeout, so several writer processes queue instead of failing with
"database is locked" (a deferred transaction that reads first cannot upgrade its lock).
Times come from the database's clock (``Now()``: ``STATEMENT_TIMESTAMP()`` on PostgreSQL).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta

from django.db import connections, router, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Now
from django.utils import timezone

from django_debounce.backends.base import BaseBackend
from django_debounce.keys import dumps
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.state import (
    Claim,
    Dispatch,
    FireAction,
    FireDecision,
    TriggerResult,
)

State = DebounceKey.State
logger = logging.getLogger("django_debounce")


def _seconds(delta: timedelta) -> float:
    return max(delta.total_seconds(), 0.0)


class DatabaseBackend(BaseBackend):
    """Row-lock store on any Django database (PostgreSQL, SQLite, MySQL)."""

    name = "database"

    # -- plumbing -------------------------------------------------------------------------

    @property
    def alias(self) -> str:
        return router.db_for_write(DebounceKey)

    def _lock(
        self, key_hash: str, now: datetime | None = None
    ) -> tuple[DebounceKey | None, datetime]:
        row = (
            DebounceKey.objects.using(self.alias)
            .select_for_update()
            .annotate(db_now=Now())
            .filter(key_hash=key_hash)
            .first()
        )
        if row is None:
            return None, now or timezone.now()
        return row, now or row.db_now

    def _save(self, row: DebounceKey) -> None:
        row.state = (
            State.RUNNING
            if row.running_until is not None
            else State.PENDING
            if row.pending
            else State.IDLE
        )
        row.store = "database"
        row.merge_until = _merge_until(row)
        row.save(using=self.alias)

    def _schedule(self, row: DebounceKey, at: datetime, now: datetime) -> Dispatch:
        """Mark a new dispatch message outstanding for ``at`` (fencing the older ones)."""
        row.scheduled_seq += 1
        row.scheduled = True
        row.scheduled_at = at
        return Dispatch(row.key_hash, row.scheduled_seq, _seconds(at - now))

    def _watchdog(self, row: DebounceKey, now: datetime) -> Dispatch | None:
        """At most one watchdog per key is parked at a time: publish one for the live run's
        lease end unless one is already due later than now."""
        if row.running_until is None:
            return None
        if row.watchdog_at is not None and row.watchdog_at > now:
            return None
        row.watchdog_at = row.running_until
        return Dispatch(
            row.key_hash, _us(row.running_until), _seconds(row.running_until - now), kind="watch"
        )

    def _recover_lease(self, row: DebounceKey, now: datetime) -> None:
        """A live run whose lease ran out is lost: its triggers go back to pending (I7)."""
        if row.running_until is None or row.running_until > now:
            return
        DebounceRun.objects.using(self.alias).filter(
            debounce_key_id=row.pk,
            store=row.store,
            run_id=row.run_id,
            outcome=DebounceRun.Outcome.RUNNING,
        ).update(outcome=DebounceRun.Outcome.LOST, finished_at=now, error="lease ran out")
        attempt = row.run_attempt
        self._unclaim(row, now)
        row.attempt = max(row.attempt, attempt + 1)  # a lost run counts as an attempt
        row.last_outcome = DebounceRun.Outcome.LOST

    def _unclaim(self, row: DebounceKey, now: datetime) -> None:
        """The live run's triggers go back to pending (a lost run, or a failed one to retry);
        its claim is taken out of the totals, so I6 counts them once, in the run that
        finally covers them."""
        claimed = row.run_triggers
        row.runs = max(row.runs - 1, 0)
        row.merged = max(row.merged - max(claimed - 1, 0), 0)
        if row.pending == 0:
            row.flight_id += 1
            row.first_trigger_at = row.run_first_trigger_at
            row.anchor_at = row.run_first_trigger_at
            row.last_trigger_at = row.last_trigger_at or row.run_first_trigger_at
            row.payload = row.run_payload
            row.due_at = now
            row.due_fixed = False
        else:
            # Newer triggers keep their quiet period (I3); the run's triggers are older and
            # are covered when this flight runs.
            row.first_trigger_at = min(row.first_trigger_at, row.run_first_trigger_at or now)
            # the earlier max_wait anchor (the run's triggers bring their first trigger time)
            row.anchor_at = min(
                row.anchor_at or row.first_trigger_at, row.run_first_trigger_at or now
            )
            if isinstance(row.run_payload, list):  # collect: the run's items come first
                row.payload = _union(row.run_payload, row.payload or [])
        row.pending += claimed
        row.attempt = max(row.attempt, row.run_attempt)
        row.running_until = None
        row.run_triggers = 0
        row.run_payload = None
        row.run_first_trigger_at = None
        row.run_attempt = 0

    def _adopt(self, row: DebounceKey) -> None:
        """Take over a row whose live state is in Redis (trigger during a Redis outage).

        The flight in Redis stays Redis's; this store opens its own flight with its own
        dispatch message, so nothing accepted here depends on Redis coming back.
        """
        row.pending = 0
        row.payload = None
        row.first_trigger_at = row.last_trigger_at = row.due_at = row.anchor_at = None
        row.scheduled = False
        row.scheduled_at = None
        row.running_until = None
        row.run_triggers = 0
        row.run_payload = None
        row.run_first_trigger_at = None
        row.run_attempt = 0
        row.watchdog_at = None
        row.due_fixed = False
        row.attempt = 0
        row.not_before = None

    def _merge(
        self, alias: str, key_hash: str, payload: str, wait: float, max_wait: float | None
    ) -> tuple[int, int, datetime] | None:
        """The hot path on PostgreSQL: a trigger that only merges into an open flight is one
        ``UPDATE ... RETURNING`` (it takes the row lock, like the full path, in one round trip).

        Returns ``None`` when the trigger is not a plain merge (new key, no message
        outstanding, lease or message overdue, the flight now due before its message):
        the full path then decides.
        """
        with connections[alias].cursor() as cursor:
            cursor.execute(
                _MERGE_SQL.format(table=DebounceKey._meta.db_table),
                [payload, wait, max_wait, key_hash, wait, max_wait],
            )
            return cursor.fetchone()

    # -- operations -----------------------------------------------------------------------

    def trigger(
        self,
        *,
        task_name,
        key,
        key_hash,
        payload,
        wait,
        max_wait,
        overlap=False,
        payload_json=None,
        leading=False,
        trailing=True,
        collect_limit=None,
        now=None,
    ):
        alias = self.alias
        if now is None and collect_limit is None and connections[alias].vendor == "postgresql":
            merged = self._merge(
                alias, key_hash, payload_json or json.dumps(payload), wait, max_wait
            )
            if merged is not None:
                flight_id, pending, due_at = merged
                return TriggerResult(key, flight_id, pending, due_at, scheduled=False), None, None
        with transaction.atomic(using=alias):
            DebounceKey.objects.using(self.alias).bulk_create(
                [
                    DebounceKey(
                        key=key, key_hash=key_hash, task_name=task_name, scheduled_seq=_seq_base()
                    )
                ],
                ignore_conflicts=True,
            )
            row, now = self._lock(key_hash, now)
            assert row is not None
            if row.store != "database":
                self._adopt(row)
            row.overlap = overlap
            self._recover_lease(row, now)
            undo = {
                "opened": row.pending == 0,
                "payload": row.payload,
                "last_trigger_at": row.last_trigger_at,
                "due_at": row.due_at,
                "due_fixed": row.due_fixed,
                "at": now,
            }
            if row.pending == 0:
                continues = _continues(row, now, wait, max_wait)
                edge = _edge(continues, leading, trailing)
                if edge == "drop":
                    # trailing=False: inside the window of a leading run (lodash drops it)
                    row.triggers += 1
                    row.cancelled += 1
                    row.last_trigger_at = now
                    self._save(row)
                    result = TriggerResult(key, row.flight_id, 0, None, False, dropped=True)
                    return result, None, None
                row.flight_id += 1
                row.first_trigger_at = now
                # The max_wait anchor: the last run's claim while the stream goes on
                # (lodash's lastInvokeTime), else this trigger (lodash's leadingEdge).
                row.anchor_at = row.last_run_at if continues and max_wait is not None else now
                row.payload = [] if collect_limit is not None else None
                row.due_fixed = edge == "leading"
                row.attempt = 0
                row.not_before = None
            row.pending += 1
            row.triggers += 1
            row.last_trigger_at = now
            undo["pending"] = row.pending
            undo["flight"] = row.flight_id
            full = False
            if collect_limit is not None:
                items = list(row.payload or [])
                added = _add_item(items, payload)
                undo["added"] = added
                undo["item"] = payload
                row.payload = items
                full = len(items) >= collect_limit
            else:
                row.payload = payload
            if row.due_fixed and row.due_at is not None:
                due = row.due_at  # a leading or full flight is not delayed by later triggers
            elif row.due_fixed or full:
                due = now
            else:
                due = now + timedelta(seconds=wait)
                if max_wait is not None:
                    # a flight opened before the anchor existed (NULL) counts from its first
                    anchor = row.anchor_at or row.first_trigger_at
                    due = min(due, anchor + timedelta(seconds=max_wait))
                if not undo["opened"] and row.due_at is not None:
                    # Never earlier than the due time given to the flight's earlier triggers
                    # (I3): a lost or retried run that rejoined it brought an older anchor.
                    due = max(due, row.due_at)
            if full:
                row.due_fixed = True
            if row.not_before is not None and due < row.not_before:
                due = row.not_before  # a retry's backoff: later triggers join the retry
            row.due_at = due
            dispatch = None
            lost_message = (
                row.scheduled
                and row.scheduled_at is not None
                and row.scheduled_at + timedelta(seconds=_grace()) < now
            )
            if row.running_until is not None and not overlap:
                dispatch = self._watchdog(row, now)  # the finishing run schedules the flight
            elif (
                not row.scheduled
                or lost_message
                or (row.scheduled_at is not None and row.scheduled_at > due)
            ):
                dispatch = self._schedule(row, due, now)
            self._save(row)
        result = TriggerResult(
            key=key,
            flight_id=row.flight_id,
            pending=row.pending,
            due_at=row.due_at,
            scheduled=dispatch is not None and dispatch.kind == "fire",
        )
        return result, dispatch, undo

    def abort_trigger(self, key_hash, seq, undo):
        with transaction.atomic(using=self.alias):
            row, _now = self._lock(key_hash)
            if row is None or row.pending == 0:
                return
            if undo.get("flight") is not None and row.flight_id != undo["flight"]:
                return  # its flight ran meanwhile (a parked lease watchdog outlives its run)
            if undo.get("kind") == "watch":
                if row.watchdog_at is None or _us(row.watchdog_at) != seq:
                    return
                row.watchdog_at = None
            else:
                if row.scheduled_seq != seq or not row.scheduled:
                    return
                row.scheduled = False
                row.scheduled_at = None
            row.pending -= 1
            row.triggers -= 1
            restored = False
            if row.pending == 0:
                row.flight_id -= 1 if undo["opened"] else 0
                row.first_trigger_at = row.due_at = row.anchor_at = None
                # the key's last trigger is the one before (the next trigger's edge uses it)
                row.last_trigger_at = undo["last_trigger_at"]
                row.payload = None
                row.due_fixed = False
            elif row.last_trigger_at == undo["at"] and undo["due_at"] is not None:
                # No trigger came after the one taken back: the flight is as it was before it
                # (collected items: see below).
                if not isinstance(row.payload, list):
                    row.payload = undo["payload"]
                row.last_trigger_at = undo["last_trigger_at"]
                row.due_at = undo["due_at"]
                if row.not_before is not None:  # a retry's backoff that began since
                    row.due_at = max(row.due_at, row.not_before)
                row.due_fixed = undo.get("due_fixed", row.due_fixed)
                restored = True
            if row.pending and undo.get("added") and isinstance(row.payload, list):
                # The item it added goes when no pending trigger can have it too: nothing came
                # after it, nor did a run rejoin the flight (pending as the trigger left it: a
                # retried or lost run's items may include it); or the flight holds one item
                # per pending trigger, so none sent it again. Otherwise it stays (a run of it
                # rather than a trigger lost, I1).
                alone = restored and row.pending + 1 == undo.get("pending")
                if alone or len(row.payload) == row.pending + 1:
                    row.payload = [i for i in row.payload if dumps(i) != dumps(undo["item"])]
            # Otherwise later triggers merged meanwhile (believing a message was out): they keep
            # their payload and due time, and with no message outstanding now, the next trigger
            # or recovery publishes one for them.
            self._save(row)

    def fire(self, key_hash, seq, *, overlap, lease, now=None, store=None, collect_limit=None):
        with transaction.atomic(using=self.alias):
            row, now = self._lock(key_hash, now)
            if row is None:
                return FireDecision(FireAction.DROP)
            row.overlap = overlap
            self._recover_lease(row, now)
            if seq is not None and (
                seq != row.scheduled_seq or not row.scheduled or row.store != "database"
            ):
                self._save(row)
                return FireDecision(FireAction.DROP)
            if row.pending == 0:
                row.scheduled = False
                self._save(row)
                return FireDecision(FireAction.DROP)
            if row.due_at is None:
                row.due_at = now  # defensive: a pending flight always has a due time
            if now < row.due_at:
                dispatch = self._schedule(row, row.due_at, now)
                self._save(row)
                return FireDecision(FireAction.REARM, dispatch=dispatch)
            if row.running_until is not None and not overlap:
                # The finishing run schedules this flight; a watchdog at the end of the live
                # run's lease makes sure a run whose worker died is still redone (I7).
                row.scheduled = False
                row.scheduled_at = None
                dispatch = self._watchdog(row, now)
                self._save(row)
                return FireDecision(FireAction.WAIT, dispatch=dispatch)
            claim, follow = self._claim(row, now, lease, collect_limit)
            self._save(row)
            DebounceRun.objects.using(self.alias).create(
                debounce_key_id=row.pk,
                store="database",
                task_name=row.task_name,
                flight_id=claim.flight_id,
                run_id=claim.run_id,
                attempt=claim.attempt,
                triggers=claim.triggers,
                first_trigger_at=claim.first_trigger_at,
                last_trigger_at=claim.last_trigger_at,
                due_at=claim.due_at,
                started_at=now,
                delay=_seconds(now - claim.last_trigger_at),
            )
        return FireDecision(FireAction.CLAIM, claim=claim, dispatch=follow)

    def _claim(
        self, row: DebounceKey, now: datetime, lease: float, collect_limit: int | None
    ) -> tuple[Claim, Dispatch | None]:
        """Turn the due flight into run ``run_id + 1``. In collect mode a run takes at most
        ``collect_limit`` items; the rest (one trigger each) stay pending as the next flight,
        with the flight's times, due at once when still full. Returns the claim and, with
        overlap, the message for that next flight."""
        row.run_id += 1
        payload, rest = row.payload, None
        if collect_limit is not None and isinstance(payload, list) and len(payload) > collect_limit:
            payload, rest = payload[:collect_limit], payload[collect_limit:]
        claimed = row.pending - (len(rest) if rest else 0)
        claim = Claim(
            key_hash=row.key_hash,
            key=row.key,
            task_name=row.task_name,
            run_id=row.run_id,
            flight_id=row.flight_id,
            triggers=claimed,
            payload=payload,
            first_trigger_at=row.first_trigger_at,
            last_trigger_at=row.last_trigger_at,
            due_at=row.due_at,
            started_at=now,
            attempt=row.attempt,
        )
        row.running_until = now + timedelta(seconds=lease)
        row.run_triggers = claimed
        row.run_payload = payload
        row.run_first_trigger_at = row.first_trigger_at
        row.run_attempt = row.attempt
        row.runs += 1
        row.merged += claimed - 1
        row.attempt = 0
        row.not_before = None
        row.scheduled = False
        row.scheduled_at = None
        row.last_run_at = now
        follow = None
        if rest:
            row.flight_id += 1
            row.pending = len(rest)
            row.payload = rest
            row.due_fixed = len(rest) >= (collect_limit or 0)
            row.due_at = now if row.due_fixed else row.due_at
            if row.overlap:
                follow = self._schedule(row, row.due_at, now)
        else:
            row.pending = 0
            row.payload = None
            row.first_trigger_at = row.anchor_at = None
            row.due_at = None
            row.due_fixed = False
        return claim, follow

    def finish(self, key_hash, run_id, *, ok, error="", retry_in=None, store=None, now=None):
        if ok:
            outcome = DebounceRun.Outcome.SUCCESS
        elif retry_in is not None:
            outcome = DebounceRun.Outcome.RETRY
        else:
            outcome = DebounceRun.Outcome.FAILURE
        with transaction.atomic(using=self.alias):
            row, now = self._lock(key_hash, now)
            if row is None:
                return None
            lost = row.running_until is not None and row.running_until <= now
            self._recover_lease(row, now)
            current = row.run_id == run_id and row.running_until is not None
            DebounceRun.objects.using(self.alias).filter(
                debounce_key_id=row.pk,
                store="database",
                run_id=run_id,
                outcome=DebounceRun.Outcome.RUNNING,
            ).update(
                outcome=outcome if current else DebounceRun.Outcome.LOST,
                finished_at=now,
                error=error if current else (error or "finished after its lease ran out"),
            )
            if not current:
                # A late finisher after its lease ran out changes nothing; the flight its lost
                # run went back to (recovered just now) gets its message.
                dispatch = None
                if lost and row.pending and row.running_until is None and not row.scheduled:
                    dispatch = self._schedule(row, max(row.due_at or now, now), now)
                self._save(row)
                return dispatch
            row.last_outcome = outcome
            if outcome == DebounceRun.Outcome.RETRY:
                attempt = row.run_attempt + 1
                self._unclaim(row, now)
                row.attempt = attempt
                row.not_before = now + timedelta(seconds=max(retry_in, 0.0))
                row.due_at = max(row.due_at or now, row.not_before)
                row.due_fixed = False
            else:
                row.running_until = None
                row.run_triggers = 0
                row.run_payload = None
                row.run_first_trigger_at = None
                row.run_attempt = 0
            dispatch = None
            if row.pending:
                at = max(row.due_at or now, now)
                if not row.scheduled or row.scheduled_at is None or row.scheduled_at > at:
                    dispatch = self._schedule(row, at, now)
            self._save(row)
        return dispatch

    def watch(self, key_hash, at, *, store=None, now=None):
        with transaction.atomic(using=self.alias):
            row, now = self._lock(key_hash, now)
            if row is None or row.store != "database":
                return None
            self._recover_lease(row, now)
            dispatch = None
            current = (
                row.watchdog_at is None or _us(row.watchdog_at) == at or row.watchdog_at <= now
            )
            if row.running_until is not None:
                if current:
                    row.watchdog_at = None
                    dispatch = self._watchdog(row, now)
            else:
                if current:
                    row.watchdog_at = None
                if row.pending and not row.scheduled:
                    dispatch = self._schedule(row, max(row.due_at or now, now), now)
            self._save(row)
        return dispatch

    def heartbeat(self, key_hash, run_id, lease, *, store=None, now=None):
        with transaction.atomic(using=self.alias):
            row, now = self._lock(key_hash, now)
            if row is None or row.run_id != run_id or row.running_until is None:
                return False
            if row.running_until <= now:
                return False  # the lease ran out: the run is lost (as _recover_lease has it)
            row.running_until = now + timedelta(seconds=lease)
            self._save(row)
        return True

    def flush(self, key_hash, *, now=None):
        with transaction.atomic(using=self.alias):
            row, now = self._lock(key_hash, now)
            if row is None or row.pending == 0:
                return None
            row.due_at = now
            row.not_before = None
            dispatch = self._schedule(row, now, now)
            self._save(row)
        return dispatch

    def cancel(self, key_hash, *, now=None):
        with transaction.atomic(using=self.alias):
            row, _now = self._lock(key_hash, now)
            if row is None:
                return 0
            if row.pending == 0:
                # Nothing to drop, but the edge resets as lodash's cancel() resets it (the
                # next trigger of a leading task leads at once), also while a run is live.
                # An update of that one field: the row keeps its store and state.
                if row.last_trigger_at is not None:
                    DebounceKey.objects.using(self.alias).filter(pk=row.pk).update(
                        last_trigger_at=None
                    )
                return 0
            dropped = row.pending
            row.cancelled += dropped
            row.pending = 0
            row.payload = None
            row.first_trigger_at = row.last_trigger_at = row.due_at = row.anchor_at = None
            row.due_fixed = False
            row.attempt = 0
            row.not_before = None
            row.scheduled_seq += 1  # any outstanding message is now stale
            row.scheduled = False
            row.scheduled_at = None
            self._save(row)
        return dropped

    def due_keys(self, now=None, task_names=None):
        qs = DebounceKey.objects.using(self.alias).filter(pending__gt=0, due_at__lte=now or Now())
        if task_names is not None:
            qs = qs.filter(task_name__in=task_names)
        return list(qs.order_by("due_at").values_list("task_name", "key_hash"))

    def recover(self, *, grace, adopt=(), now=None):
        """Step 5 on rows this store owns, plus ``adopt``: key hashes of rows mirrored from
        Redis whose Redis state is gone (a Redis restarted empty); those flights are then run
        from their durable record."""
        out: list[tuple[str, Dispatch]] = []
        qs = DebounceKey.objects.using(self.alias).filter(
            Q(store="database") | Q(key_hash__in=list(adopt)),
            state__in=[State.PENDING, State.RUNNING],  # the state index: idle rows need nothing
        )
        clock = now or timezone.now()
        cutoff = clock - timedelta(seconds=grace)
        candidates = (
            list(qs.filter(running_until__lte=clock).values_list("key_hash", flat=True))
            + list(
                qs.filter(pending__gt=0, scheduled=False, running_until__isnull=True).values_list(
                    "key_hash", flat=True
                )
            )
            + list(
                qs.filter(pending__gt=0, scheduled=True, scheduled_at__lt=cutoff).values_list(
                    "key_hash", flat=True
                )
            )
        )
        for key_hash in dict.fromkeys(candidates):
            try:
                dispatch = self._recover_one(key_hash, grace, now)
            except Exception:  # one bad row must not stop the recovery of every other key
                logger.exception("django_debounce: recovery of key %s failed", key_hash)
                continue
            if dispatch is not None:
                out.append(dispatch)
        return out

    def _recover_one(
        self, key_hash: str, grace: float, now: datetime | None = None
    ) -> tuple[str, Dispatch] | None:
        out = None
        with transaction.atomic(using=self.alias):
            row, now = self._lock(key_hash, now)
            if row is None:
                return None
            self._recover_lease(row, now)
            overdue = (
                row.scheduled
                and row.scheduled_at is not None
                and row.scheduled_at + timedelta(seconds=grace) < now
            )
            if row.pending and row.running_until is None and (not row.scheduled or overdue):
                at = max(row.due_at or now, now)
                out = (row.task_name, self._schedule(row, at, now))
            self._save(row)
        return out

    def live_state(self, key_hash):
        return (
            DebounceKey.objects.using(self.alias)
            .filter(key_hash=key_hash)
            .annotate(seq=F("scheduled_seq"), store_code=Value("d"))
            .values(
                "pending",
                "flight_id",
                "triggers",
                "runs",
                "merged",
                "cancelled",
                "state",
                "seq",
                "store_code",
            )
            .first()
        )

    def pending_counts(self, key_hashes):
        return dict(
            DebounceKey.objects.using(self.alias)
            .filter(key_hash__in=key_hashes)
            .values_list("key_hash", "pending")
        )


# due_at = max(due_at, min(now + wait, anchor + max_wait)); a NULL max_wait leaves the second
# term NULL, which LEAST ignores; a flight opened before the anchor existed counts from its first.
_DUE_SQL = (
    "GREATEST(due_at, LEAST(STATEMENT_TIMESTAMP() + %s * INTERVAL '1 second',"
    " COALESCE(anchor_at, first_trigger_at) + %s * INTERVAL '1 second'))"
)
# A flight this trigger makes due before its outstanding message (max_wait from an early
# anchor) is no plain merge: the full path publishes a message for the earlier time.
_MERGE_SQL = (
    "UPDATE {table} SET pending = pending + 1, triggers = triggers + 1,"
    " last_trigger_at = STATEMENT_TIMESTAMP(), payload = %s::jsonb,"
    f" due_at = {_DUE_SQL}"
    " WHERE key_hash = %s AND merge_until > STATEMENT_TIMESTAMP()"
    f" AND (scheduled_at IS NULL OR {_DUE_SQL} >= scheduled_at)"
    " RETURNING flight_id, pending, due_at"
)


def _continues(row: DebounceKey, now: datetime, wait: float, max_wait: float | None) -> bool:
    """Whether a trigger at ``now`` that opens a flight continues the key's stream of triggers
    (lodash's ``shouldInvoke`` is false): the key's last trigger is less than ``wait`` ago
    (``timeSinceLastCall < wait``; ``cancel`` clears it) and, with ``max_wait``, its last run
    was claimed less than ``max_wait`` ago (``timeSinceLastInvoke < maxWait``). Otherwise the
    trigger starts a new burst (lodash's ``leadingEdge``).
    """
    last = row.last_trigger_at
    if last is None or (now - last).total_seconds() >= wait:
        return False
    if max_wait is None:
        return True
    ran = row.last_run_at
    return ran is not None and (now - ran).total_seconds() < max_wait


def _edge(continues: bool, leading: bool, trailing: bool) -> str:
    """How a trigger that opens a flight starts it (edge semantics as lodash debounce).

    ``"leading"``: with ``leading``, a trigger that starts a new burst (``continues`` false):
    the flight is due at once. ``"drop"``: with ``trailing=False``, any other trigger (it
    falls inside the window of a leading run). ``"trailing"``: a flight due ``wait`` after
    its last trigger (at most ``max_wait`` after its anchor).
    """
    if leading and not continues:
        return "leading"
    return "trailing" if trailing else "drop"


def _add_item(items: list, item: object) -> bool:
    """Append ``item`` unless an equal JSON value is there (collect keeps distinct items in
    trigger order); returns whether it was added."""
    encoded = dumps(item)
    if any(dumps(i) == encoded for i in items):
        return False
    items.append(item)
    return True


def _union(first: list, then: list) -> list:
    """``first`` followed by the items of ``then`` not already in it (by JSON value)."""
    out = list(first)
    seen = {dumps(i) for i in out}
    for item in then:
        if dumps(item) not in seen:
            seen.add(dumps(item))
            out.append(item)
    return out


def _merge_until(row: DebounceKey) -> datetime | None:
    """Until when a trigger of this key only merges (same rule as ``merge_until`` in the Redis
    store's Lua): a flight is open with its dispatch message outstanding and not overdue, or a
    live run (no overlap) will schedule it and its lease watchdog is parked. A flight whose
    due time is fixed (leading edge, full batch) or held by a retry backoff, and collected
    flights (whose payload is a list), always take the full path."""
    if row.pending == 0 or row.due_fixed or row.not_before is not None:
        return None
    if isinstance(row.payload, list):
        return None
    grace = timedelta(seconds=_grace())
    if row.running_until is None:
        return row.scheduled_at + grace if row.scheduled and row.scheduled_at else None
    if row.overlap:
        if row.scheduled and row.scheduled_at:
            return min(row.scheduled_at + grace, row.running_until)
        return None
    return min(row.running_until, row.watchdog_at) if row.watchdog_at else None


def _us(value: datetime) -> int:
    return int(round(value.timestamp() * 1_000_000))


def _seq_base() -> int:
    """First dispatch sequence of a new row: microseconds since the epoch.

    A key purged and created again starts above every sequence its earlier row issued, so a
    late message of the old row can never match the new one (I5).
    """
    return int(time.time() * 1_000_000)


def _grace() -> float:
    from django_debounce import conf

    return conf.seconds_of("DISPATCH_GRACE")
