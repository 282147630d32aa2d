"""A key's record: its ``DebounceKey`` row, read under the row lock into the rules of
``machine.py`` and written back with its due index entry and its run rows (docs/design.md,
"One record per key" and "The database layout").

``FIELDS`` is the one table of a key's state: each attribute of ``machine.KeyModel`` and the
column that holds it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, models, transaction
from django.db.models import OuterRef, Subquery

from django_debounce.dbtime import AwareDateTimeField
from django_debounce.machine import US, Config, KeyModel
from django_debounce.models import DebounceDue, DebounceKey, DebounceRun
from django_debounce.state import FlightOptions

# attribute of KeyModel -> column of DebounceKey
FIELDS: dict[str, str] = {
    "pending": "pending",
    "flight_id": "flight_id",
    "first": "first_trigger_at",
    "last": "last_trigger_at",
    "anchor": "anchor_at",
    "bound": "bound_at",
    "due": "due_at",
    "payload": "payload",
    "due_fixed": "due_fixed",
    "attempt": "attempt",
    "attempted": "attempted",
    "not_before": "not_before",
    "seq": "scheduled_seq",
    "taken": "scheduled",
    "taken_at": "scheduled_at",
    "run_id": "run_id",
    "run_seq": "run_seq",
    "running_until": "running_until",
    "run_triggers": "run_triggers",
    "run_payload": "run_payload",
    "run_first": "run_first_trigger_at",
    "run_anchor": "run_anchor_at",
    "run_bound": "run_bound_at",
    "run_attempted": "run_attempted",
    "run_attempt": "run_attempt",
    "last_run_at": "last_run_at",
    "triggers": "triggers",
    "runs": "runs",
    "merged": "merged",
    "cancelled": "cancelled",
}
TIMES = frozenset(
    a for a, c in FIELDS.items() if isinstance(DebounceKey._meta.get_field(c), models.DateTimeField)
)
# columns a step reads besides the state
HEAD = ("id", "key", "key_hash", "task_name", "overlap", "counter_id", "counter_until")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_us(value: datetime | None) -> int | None:
    """Microseconds since the epoch of an aware time (``None`` stays ``None``)."""
    if value is None:
        return None
    delta = value - EPOCH
    return (delta.days * 86_400 + delta.seconds) * US + delta.microseconds


def to_dt(value: int | None) -> datetime | None:
    """The aware UTC time of microseconds since the epoch (``None`` stays ``None``)."""
    return None if value is None else EPOCH + timedelta(microseconds=value)


def config(options: FlightOptions) -> Config:
    """A task's options as the rules take them (durations in microseconds)."""
    return Config(
        wait=int(round(options.wait * US)),
        max_wait=None if options.max_wait is None else int(round(options.max_wait * US)),
        leading=options.leading,
        trailing=options.trailing,
        overlap=options.overlap,
        collect_limit=options.collect_limit,
        lease=int(round(options.lease * US)),
        collect_bytes=options.collect_bytes,
    )


@dataclass
class Record:
    """One key's row, locked for the step: the rules' state (``key``), what it was when read
    (to write only what changed), and the counter fence (``counter_id``, ``counter_until``,
    docs/design.md "The counter and its fences")."""

    pk: int
    key_text: str
    key_hash: str
    task_name: str
    key: KeyModel
    entry: int | None  # the entry in the due index as read
    counter_id: int
    counter_until: int | None
    orig: dict[str, Any] = field(default_factory=dict)
    last_outcome: str | None = None  # set when a step decides the outcome column
    new_runs: list[DebounceRun] = field(default_factory=list)
    ended: list[tuple[int, str, str]] = field(default_factory=list)  # (run_id, outcome, error)
    extra: dict[str, Any] = field(default_factory=dict)  # what a store keeps for after the step

    def changes(self) -> dict[str, Any]:
        """The columns to write: the state that changed, the coarse ``state``, the counter
        fence, and ``last_outcome`` when set."""
        k = self.key
        out: dict[str, Any] = {}
        for attr, col in FIELDS.items():
            value = getattr(k, attr)
            if value != self.orig[attr] or type(value) is not type(self.orig[attr]):
                out[col] = to_dt(value) if attr in TIMES else value
        state = "running" if k.running_until is not None else "pending" if k.pending else "idle"
        if state != self.orig["state"]:
            out["state"] = state
        if self.counter_id != self.orig["counter_id"]:
            out["counter_id"] = self.counter_id
        if self.counter_until != self.orig["counter_until"]:
            out["counter_until"] = to_dt(self.counter_until)
        if self.last_outcome is not None:
            out["last_outcome"] = self.last_outcome
        return out


class Rows:
    """Reads and writes records in the database ``alias`` (PostgreSQL or SQLite)."""

    def __init__(self, alias: str, retake: int, direct: int) -> None:
        self.alias = alias
        self.retake = retake
        self.direct = direct
        self.pg = connections[alias].vendor == "postgresql"
        self.now_given: int | None = None  # the step's time when the caller gave it
        self.read_at = 0.0  # time.monotonic() when the step's time was read

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One step's transaction (SQLite: an immediate one, as the settings ask)."""
        with transaction.atomic(using=self.alias):
            yield

    def clock(self, now: datetime | None) -> int:
        """The step's time: ``now`` when given, else the database's clock (PostgreSQL's
        ``clock_timestamp()``; SQLite's is this host's, the database being a local file)."""
        self.read_at = time.monotonic()
        if now is not None:
            at = to_us(now)
            assert at is not None
            self.now_given = at
            return at
        if self.pg:
            with connections[self.alias].cursor() as cursor:
                cursor.execute("SELECT clock_timestamp()")
                value = cursor.fetchone()[0]
            at = to_us(value if value.tzinfo else value.replace(tzinfo=UTC))
            assert at is not None
            return at
        return int(datetime.now(UTC).timestamp() * US)

    def _query(self, lock: bool, skip_locked: bool = False) -> models.QuerySet:
        qs = DebounceKey.objects.using(self.alias)
        if lock:
            qs = qs.select_for_update(skip_locked=skip_locked, of=("self",))
        entry = DebounceDue.objects.using(self.alias).filter(key_hash=OuterRef("key_hash"))
        return qs.annotate(
            entry=Subquery(entry.values("due_at")[:1], output_field=AwareDateTimeField())
        )

    def _record(self, row: dict[str, Any], cfg: Config | None) -> Record:
        if cfg is None:  # a step that needs no option but the row's overlap
            cfg = Config(0, None, False, True, bool(row["overlap"]), None, 0)
        k = KeyModel(cfg, self.retake, self.direct, exists=True)
        orig: dict[str, Any] = {}
        for attr, col in FIELDS.items():
            value = row[col]
            if attr in TIMES:
                value = to_us(value)
            elif attr == "payload" and cfg.collect and value is not None:
                value = value if isinstance(value, list) else [value]
            setattr(k, attr, value)
            orig[attr] = value
        if k.pending and k.anchor is None:
            k.anchor = k.first
        orig.update(
            state=row["state"],
            counter_id=row["counter_id"],
            counter_until=to_us(row["counter_until"]),
        )
        k.entry = to_us(row["entry"])
        return Record(
            pk=row["id"],
            key_text=row["key"],
            key_hash=row["key_hash"],
            task_name=row["task_name"],
            key=k,
            entry=k.entry,
            counter_id=row["counter_id"],
            counter_until=orig["counter_until"],
            orig=orig,
        )

    def lock(self, key_hash: str, cfg: Config | None) -> Record | None:
        """The record of ``key_hash``, locked for this transaction (``None``: no row)."""
        rows = self._query(True).filter(key_hash=key_hash).values(*self.columns())
        row = next(iter(rows), None)
        return None if row is None else self._record(row, cfg)

    def lock_many(
        self, key_hashes: list[str], cfgs: dict[str, Config], *, skip_locked: bool = False
    ) -> dict[str, Record]:
        """The records of ``key_hashes`` (``cfgs`` by task name), locked in key-hash order so
        concurrent batches never deadlock; ``skip_locked`` leaves out rows another
        transaction holds."""
        if not key_hashes:
            return {}
        qs = self._query(True, skip_locked).filter(key_hash__in=key_hashes).order_by("key_hash")
        out = {}
        for row in qs.values(*self.columns()):
            out[row["key_hash"]] = self._record(row, cfgs.get(row["task_name"]))
        return out

    def lock_or_create(self, key_hash: str, key: str, task_name: str, cfg: Config) -> Record:
        """The record of ``key_hash``, made first when there is none."""
        record = self.lock(key_hash, cfg)
        if record is None:
            self.create([(key_hash, key)], task_name, cfg.overlap)
            record = self.lock(key_hash, cfg)
            assert record is not None
        return record

    def create(self, keys: list[tuple[str, str]], task_name: str, overlap: bool) -> None:
        """Rows for ``(key_hash, key)`` pairs that have none (others are left alone)."""
        DebounceKey.objects.using(self.alias).bulk_create(
            [DebounceKey(key_hash=h, key=k, task_name=task_name, overlap=overlap) for h, k in keys],
            ignore_conflicts=True,
        )

    def read(self, key_hash: str, cfg: Config | None) -> Record | None:
        """The record of ``key_hash`` without a lock (for views)."""
        rows = self._query(False).filter(key_hash=key_hash).values(*self.columns())
        row = next(iter(rows), None)
        return None if row is None else self._record(row, cfg)

    @staticmethod
    def columns() -> list[str]:
        return [*HEAD, "state", *FIELDS.values(), "entry"]

    def write(self, record: Record, now: int, *, reindex: bool = True) -> None:
        """Write a step's result: the changed columns, the due index entry (unless the step
        was a plain merge, which leaves it: it may be early, never late), the runs it
        claimed, and the outcomes of the runs it ended or lost."""
        k = record.key
        for run_id in k.events:
            record.ended.append((run_id, "lost", "lease ran out"))
            record.last_outcome = "lost"
        k.events = []
        changes = record.changes()
        if changes:
            changes["updated_at"] = to_dt(now)
            DebounceKey.objects.using(self.alias).filter(pk=record.pk).update(**changes)
        if reindex and k.entry != record.entry:
            due = DebounceDue.objects.using(self.alias)
            if k.entry is None:
                due.filter(key_hash=record.key_hash).delete()
            elif record.entry is None:
                due.create(
                    key_hash=record.key_hash, task_name=record.task_name, due_at=to_dt(k.entry)
                )
            else:
                due.filter(key_hash=record.key_hash).update(due_at=to_dt(k.entry))
        if record.new_runs:
            DebounceRun.objects.using(self.alias).bulk_create(record.new_runs)
        finished = to_dt(now)
        for run_id, outcome, error in record.ended:
            DebounceRun.objects.using(self.alias).filter(
                debounce_key_id=record.pk, run_id=run_id
            ).update(outcome=outcome, finished_at=finished, error=error)
        record.new_runs, record.ended = [], []
        record.entry = k.entry
