"""A key's record: its ``DebounceKey`` row, read under the row lock into the rules of
``machine.py`` and written back with its due index entry and its run rows (docs/design.md,
"One record per key" and "The database layout").

``FIELDS`` is the one table of a key's state: each attribute of ``machine.KeyModel`` and the
column that holds it.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, models, transaction

from django_debounce.dbtime import from_db, to_db
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
    "run_flight": "run_flight_id",
    "run_last": "run_last_trigger_at",
    "run_due": "run_due_at",
    "run_started": "run_started",
    "last_run_at": "last_run_at",
    "triggers": "triggers",
    "runs": "runs",
    "merged": "merged",
    "cancelled": "cancelled",
}
BLANK = {attr: getattr(KeyModel, attr) for attr in FIELDS}  # a new key's state (defaults)
TIMES = frozenset(
    a for a, c in FIELDS.items() if isinstance(DebounceKey._meta.get_field(c), models.DateTimeField)
)
JSONS = frozenset(
    a for a, c in FIELDS.items() if isinstance(DebounceKey._meta.get_field(c), models.JSONField)
)
BOOLS = frozenset(
    a for a, c in FIELDS.items() if isinstance(DebounceKey._meta.get_field(c), models.BooleanField)
)
# columns a step reads besides the state
HEAD = ("id", "key", "key_hash", "task_name", "overlap", "counter_id", "counter_until", "state")
COLUMNS = (*HEAD, *FIELDS.values())
FIELD = {f.column: f for f in DebounceKey._meta.concrete_fields}
RUN_FIELD = {f.column: f for f in DebounceRun._meta.concrete_fields}
JSON_COLUMNS = frozenset(c for c, f in FIELD.items() if isinstance(f, models.JSONField))
TIME_COLUMNS = frozenset(c for c, f in FIELD.items() if isinstance(f, models.DateTimeField))
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def q(name: str) -> str:
    """A quoted identifier (the same in PostgreSQL and SQLite)."""
    return f'"{name}"'


KEY = q(DebounceKey._meta.db_table)
DUE = q(DebounceDue._meta.db_table)
DUE_COLUMNS = ("key_hash", "task_name", "due_at")
UPSERT_DUE_TAIL = (
    f"ON CONFLICT ({q('key_hash')}) DO UPDATE SET {q('due_at')} = EXCLUDED.{q('due_at')}"
)
UPSERT_DUE = (
    f"INSERT INTO {DUE} ({', '.join(q(c) for c in DUE_COLUMNS)}) VALUES (%s, %s, %s) "
    + UPSERT_DUE_TAIL
)


# PostgreSQL's times are read as naive UTC (``AT TIME ZONE 'UTC'``): exact whatever the
# session's zone and the driver (a naive local time is ambiguous when clocks go back), and
# cheaper than EXTRACT(EPOCH ...) to microseconds (numeric since PostgreSQL 14: 100-130 us
# more a locked read, measured). Its clock, read after a lock in the same string:
AT_UTC = " AT TIME ZONE 'UTC'"
THEN_CLOCK = f"; SELECT clock_timestamp(){AT_UTC}"
UPSERT_DUE_OF_K = UPSERT_DUE.replace("VALUES (%s, %s, %s)", "SELECT %s, %s, %s FROM k")
DELETE_DUE = f"DELETE FROM {DUE} WHERE {q('key_hash')} = %s"
RUN = q(DebounceRun._meta.db_table)
RUN_COLUMNS = tuple(
    f.column for f in DebounceRun._meta.concrete_fields if f.column not in ("id", "finished_at")
)
INSERT_RUN = (
    f"INSERT INTO {RUN} ({', '.join(q(c) for c in RUN_COLUMNS)}) "
    f"VALUES ({', '.join(['%s'] * len(RUN_COLUMNS))})"
)
# a run's outcome is written once: a late finish of a run already lost keeps "lost"
END_RUN = (
    f"UPDATE {RUN} SET {q('outcome')} = %s, {q('finished_at')} = %s, {q('error')} = %s "
    f"WHERE {q('debounce_key_id')} = %s AND {q('run_id')} = %s AND {q('outcome')} = 'running'"
)
# a new row: these columns, then every other column with a default, at its default
NEW_COLUMNS = ["key_hash", "key", "task_name", "overlap", "created_at", "updated_at"]
NEW_DEFAULTS = []
for _f in DebounceKey._meta.concrete_fields:
    if _f.column not in NEW_COLUMNS and _f.column != "id" and not _f.null:
        NEW_COLUMNS.append(_f.column)
        NEW_DEFAULTS.append(_f.get_default())


NEW_ROW_TAIL = f"ON CONFLICT ({q('key_hash')}) DO NOTHING"


@functools.cache
def _insert_text(cols: tuple[str, ...]) -> str:
    return (
        f"INSERT INTO {KEY} ({', '.join(q(c) for c in cols)}) "
        f"VALUES ({', '.join(['%s'] * len(cols))}) " + NEW_ROW_TAIL
    )


@functools.cache
def _update_text(cols: tuple[str, ...]) -> str:
    return f"UPDATE {KEY} SET {', '.join(f'{q(c)} = %s' for c in cols)} WHERE {q('id')} = %s"


def _client_binding(conn: Any) -> bool:
    """Whether ``conn`` sends queries bound on the client (psycopg 3's ``ClientCursor``,
    Django's default): PostgreSQL's simple query protocol, which runs several statements sent
    as one string."""
    options = conn.settings_dict["OPTIONS"]
    psycopg = conn.Database
    if psycopg.__name__ != "psycopg" or options.get("server_side_binding") is True:
        return False
    factory = options.get("cursor_factory", psycopg.ClientCursor)
    return isinstance(factory, type) and issubclass(factory, psycopg.ClientCursor)


@functools.cache
def _select_text(where: str, lock: bool, skip_locked: bool, pg: bool) -> str:
    names = [f"k.{q(c)}" + (AT_UTC if pg and c in TIME_COLUMNS else "") for c in COLUMNS]
    names.append(f"d.{q('due_at')}" + (AT_UTC if pg else ""))
    text = (
        f"SELECT {', '.join(names)} FROM {KEY} k "
        f"LEFT JOIN {DUE} d ON d.{q('key_hash')} = k.{q('key_hash')} WHERE {where}"
    )
    if lock:
        text += " FOR UPDATE OF k" + (" SKIP LOCKED" if skip_locked else "")
    return text


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

    pk: int | None  # None: no row yet (``Rows.blank``)
    key_text: str
    key_hash: str
    task_name: str
    key: KeyModel
    entry: int | None  # the entry in the due index as read
    counter_id: int
    counter_until: int | None
    orig: dict[str, Any] = field(default_factory=dict)
    last_outcome: str | None = None  # set when a step decides the outcome column
    new_runs: list[dict[str, Any]] = field(default_factory=list)  # column -> value
    ended: list[tuple[int, str, str]] = field(default_factory=list)  # (run_id, outcome, error)
    extra: dict[str, Any] = field(default_factory=dict)  # what a store keeps for after the step

    def state(self) -> str:
        """The coarse ``state`` column of the record as it is now."""
        k = self.key
        return "running" if k.running_until is not None else "pending" if k.pending else "idle"

    def changes(self) -> dict[str, Any]:
        """The columns to write: the state that changed, the coarse ``state``, the counter
        fence, and ``last_outcome`` when set."""
        k = self.key
        out: dict[str, Any] = {}
        for attr, col in FIELDS.items():
            value = getattr(k, attr)
            if value != self.orig[attr] or type(value) is not type(self.orig[attr]):
                out[col] = to_dt(value) if attr in TIMES else value
        state = self.state()
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
        conn = connections[alias]
        self.pg = conn.vendor == "postgresql"
        self.joined = self.pg and _client_binding(conn)
        # a ``step``'s transaction: "begin" (its BEGIN not sent yet), "open" (sent, no COMMIT
        # yet: a failure rolls it back), "done" (committed); "" outside a step
        self._state = ""
        self._queued: list[tuple[str, list[Any]]] = []  # a ``step``'s writes, sent at its end
        self.now_given: int | None = None  # the step's time when the caller gave it
        self.read_at = 0.0  # time.monotonic() when the step's time was read

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One step's transaction (SQLite: an immediate one, as the settings ask)."""
        with transaction.atomic(using=self.alias):
            yield

    @contextmanager
    def step(self) -> Iterator[None]:
        """``atomic`` for a step of one key; on PostgreSQL outside any transaction, two round
        trips instead of four: ``BEGIN`` goes out with the step's locking read, its writes
        with ``COMMIT``."""
        conn = connections[self.alias]
        if not self.joined or conn.in_atomic_block or not conn.get_autocommit():
            with self.atomic():
                yield
            return
        assert not self._state, "a step inside a step of the same Rows"
        self._state, self._queued = "begin", []
        try:
            yield
            if self._queued or self._state == "open":
                statements = [*self._queued, ("COMMIT", [])]
                if self._state == "begin":  # a step that read nothing
                    statements.insert(0, ("BEGIN", []))
                self._state = "open"
                self._execute(statements)
                self._state = "done"
        except BaseException:
            if self._state == "open":
                try:
                    with conn.cursor() as cursor:
                        cursor.execute("ROLLBACK")
                except Exception:
                    conn.close()  # a broken connection: Django opens a new one when needed
            raise
        finally:
            self._state, self._queued = "", []

    def _execute(self, statements: Sequence[tuple[str, list[Any]]]) -> None:
        """Run ``statements`` in order: one round trip when ``joined``."""
        with connections[self.alias].cursor() as cursor:
            if self.joined and len(statements) > 1:
                cursor.execute(
                    "; ".join(t for t, _p in statements), [v for _t, p in statements for v in p]
                )
                return
            for text, params in statements:
                cursor.execute(text, params)

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
                cursor.execute(f"SELECT clock_timestamp(){AT_UTC}")
                at = self._us(cursor.fetchone()[0])
            assert at is not None
            return at
        return to_us(datetime.now(UTC))  # type: ignore[return-value]

    def _us(self, value: Any) -> int | None:
        """Microseconds of a time read: PostgreSQL's naive UTC (``AT_UTC``), SQLite's text."""
        if value is None:
            return None
        if self.pg and isinstance(value, datetime) and value.tzinfo is None:
            return to_us(value.replace(tzinfo=UTC))
        return to_us(from_db(value))

    def _select(self, where: str, *, lock: bool, skip_locked: bool = False) -> str:
        """The text of a read of whole records (``where`` on the key table ``k``)."""
        return _select_text(where, lock and self.pg, skip_locked, self.pg)

    def _fetch(
        self, text: str, params: list[Any], cfgs: Any, clock: bool = False
    ) -> tuple[list[Record], int | None]:
        """The records ``text`` reads, and PostgreSQL's clock read just after (when
        ``clock``)."""
        with connections[self.alias].cursor() as cursor:
            if clock:
                text += THEN_CLOCK
            if self._state == "begin":  # the first read of a ``step`` opens its transaction
                self._state = "open"
                cursor.execute("BEGIN; " + text, params)
                cursor.nextset()
            else:
                cursor.execute(text, params)
            rows = cursor.fetchall()
            at = None
            if clock:
                cursor.nextset()
                at = self._us(cursor.fetchone()[0])
        out = []
        for row in rows:
            values = dict(zip(COLUMNS, row, strict=False))
            values["entry"] = row[-1]
            cfg = cfgs if isinstance(cfgs, Config) or cfgs is None else cfgs.get(row[3])
            out.append(self._record(values, cfg))
        return out, at

    def _record(self, row: dict[str, Any], cfg: Config | None) -> Record:
        if cfg is None:  # a step that needs no option but the row's overlap
            cfg = Config(0, None, False, True, bool(row["overlap"]), None, 0)
        k = KeyModel(cfg, self.retake, self.direct, exists=True)
        orig: dict[str, Any] = {}
        for attr, col in FIELDS.items():
            value = row[col]
            if attr in TIMES:
                value = self._us(value)
            elif attr in JSONS:
                if isinstance(value, str):
                    value = json.loads(value)
                if attr == "payload" and cfg.collect and value is not None:
                    value = value if isinstance(value, list) else [value]
            elif attr in BOOLS:
                value = bool(value)
            setattr(k, attr, value)
            orig[attr] = value
        if k.pending and k.anchor is None:
            k.anchor = k.first
        orig.update(
            state=row["state"],
            counter_id=row["counter_id"],
            counter_until=self._us(row["counter_until"]),
        )
        k.entry = self._us(row["entry"])
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
        text = self._select(f"k.{q('key_hash')} = %s", lock=True)
        got, _at = self._fetch(text, [key_hash], cfg)
        return got[0] if got else None

    def lock_at(
        self, key_hash: str, cfg: Config | None, now: datetime | None
    ) -> tuple[Record | None, int]:
        """``lock`` and the step's time (``clock(now)``), read together on PostgreSQL."""
        if now is not None or not self.pg:
            at = self.clock(now)
            return self.lock(key_hash, cfg), at
        if not self.joined:  # one statement per execute: the clock once the lock is held
            record = self.lock(key_hash, cfg)
            return record, self.clock(None)
        # the clock is read after the lock is held, in the same round trip
        self.read_at = time.monotonic()
        text = self._select(f"k.{q('key_hash')} = %s", lock=True)
        got, read = self._fetch(text, [key_hash], cfg, clock=True)
        assert read is not None
        return (got[0] if got else None), read

    def lock_many(
        self, key_hashes: list[str], cfgs: dict[str, Config], *, skip_locked: bool = False
    ) -> dict[str, Record]:
        """The records of ``key_hashes`` (``cfgs`` by task name), locked in key-hash order so
        concurrent batches never deadlock; ``skip_locked`` leaves out rows another
        transaction holds."""
        if not key_hashes:
            return {}
        where = f"k.{q('key_hash')} IN ({', '.join(['%s'] * len(key_hashes))})"
        text = self._select(where, lock=True, skip_locked=skip_locked)
        text = text.replace(" FOR UPDATE", f" ORDER BY k.{q('key_hash')} FOR UPDATE")
        if not self.pg:
            text += f" ORDER BY k.{q('key_hash')}"
        return {r.key_hash: r for r in self._fetch(text, list(key_hashes), cfgs)[0]}

    def blank(self, key_hash: str, key: str, task_name: str, cfg: Config) -> Record:
        """The record of a key that has no row yet: ``write`` inserts it."""
        k = KeyModel(cfg, self.retake, self.direct, exists=True)
        orig = {**BLANK, "state": "idle", "counter_id": 0, "counter_until": None}
        return Record(
            pk=None,
            key_text=key,
            key_hash=key_hash,
            task_name=task_name,
            key=k,
            entry=None,
            counter_id=0,
            counter_until=None,
            orig=orig,
        )

    def create(self, keys: list[tuple[str, str]], task_name: str, overlap: bool) -> None:
        """Rows for ``(key_hash, key)`` pairs that have none (others are left alone)."""
        stamp = self._prep("created_at", datetime.now(UTC))
        rows = [[h, key, task_name, overlap, stamp, stamp, *NEW_DEFAULTS] for h, key in keys]
        if rows:
            with connections[self.alias].cursor() as cursor:
                self._insert_rows(cursor, KEY, NEW_COLUMNS, rows, NEW_ROW_TAIL)

    def read(self, key_hash: str, cfg: Config | None) -> Record | None:
        """The record of ``key_hash`` without a lock (for views)."""
        text = self._select(f"k.{q('key_hash')} = %s", lock=False)
        got, _at = self._fetch(text, [key_hash], cfg)
        return got[0] if got else None

    def _prep(self, column: str, value: Any) -> Any:
        """``value`` of a ``DebounceKey`` or ``DebounceRun`` column as the database takes it:
        times through ``to_db`` (SQLite: Django's text), JSON through its field."""
        if value is None:
            return None
        if isinstance(value, datetime):
            return (
                to_db(value)
                if self.pg
                else RUN_FIELD["started_at"].get_db_prep_save(value, connections[self.alias])
            )
        if column in JSON_COLUMNS:
            return FIELD[column].get_db_prep_save(value, connections[self.alias])
        return value

    def _time(self, us: int | None, times: dict[int, Any]) -> Any:
        """The time ``us`` (microseconds, or ``None``) prepared for the database, kept in
        ``times``."""
        if us is None:
            return None
        if us not in times:
            times[us] = self._prep("due_at", to_dt(us))
        return times[us]

    def _steps(self, record: Record, now: int, reindex: bool) -> list[tuple[int, str, list]]:
        """The statements of a step's result on a record that has its row: ``(order, text,
        params)``, the row's changed columns (0), its due entry (1), the runs it claimed (2)
        and the outcomes of the runs it ended or lost (3)."""
        k = record.key
        steps: list[tuple[int, str, list]] = []
        changes = record.changes()
        if changes:
            if "state" in changes:  # "last state change"; a merge or a take leaves it (HOT)
                changes["updated_at"] = to_dt(now)
            cols = tuple(changes)
            params = [self._prep(c, changes[c]) for c in cols]
            steps.append((0, _update_text(cols), [*params, record.pk]))
        if reindex and k.entry != record.entry:
            if k.entry is None:
                steps.append((1, DELETE_DUE, [record.key_hash]))
            else:
                due = self._prep("due_at", to_dt(k.entry))
                steps.append((1, UPSERT_DUE, [record.key_hash, record.task_name, due]))
        for run in record.new_runs:
            run["debounce_key_id"] = record.pk
            steps.append((2, INSERT_RUN, [self._prep(c, run[c]) for c in RUN_COLUMNS]))
        finished = self._prep("finished_at", to_dt(now))
        ended: dict[int, tuple[int, str, str]] = {}
        for end in record.ended:  # the first outcome of a run wins, as it does in the table
            ended.setdefault(end[0], end)
        for run_id, outcome, error in ended.values():
            steps.append((3, END_RUN, [outcome, finished, error, record.pk, run_id]))
        record.new_runs, record.ended = [], []
        record.entry = k.entry
        return steps

    @staticmethod
    def _lost(record: Record) -> None:
        """The runs a step found lost or returned become outcomes to write."""
        k = record.key
        for run_id in k.events:
            record.ended.append((run_id, "lost", "lease ran out"))
            record.last_outcome = "lost"
        for run_id in k.returned:
            # a flush's run that its message did not start: its triggers are pending again
            record.ended.append(
                (run_id, "lost", "not started: its flush's message did not start it")
            )
        k.events, k.returned = [], []

    def write(self, record: Record, now: int, *, reindex: bool = True) -> bool:
        """Write a step's result: the changed columns (a ``blank`` record: its row), the due
        index entry (unless the step was a plain merge, which leaves it: it may be early,
        never late), the runs it claimed, and the outcomes of the runs it ended or lost; on
        PostgreSQL joined in one round trip (``_client_binding``; in a ``step``, with its
        ``COMMIT``). Returns ``False``, writing nothing, when a blank record's row was made
        meanwhile by another transaction (the caller takes the step again, in a new
        transaction)."""
        self._lost(record)
        if record.pk is None:
            with connections[self.alias].cursor() as cursor:
                return self._insert(cursor, record, now, reindex)
        statements = [(text, params) for _o, text, params in self._steps(record, now, reindex)]
        assert self._state != "done", "a write after its step's COMMIT"
        if self._state:  # a ``step``'s: they go out with its COMMIT
            self._queued += statements
        else:
            self._execute(statements)
        return True

    def _new_row(self, record: Record, now: int, times: dict[int, Any]) -> dict[str, Any]:
        """Every column of a ``blank`` record's row after its step, prepared (one column set
        for every new row). ``times``: prepared times by microseconds, shared by the rows
        of one ``write_many`` (an import's rows share most of theirs)."""
        k = record.key
        assert not record.new_runs and not record.ended, "a new row claims no run"
        values = {
            "key_hash": record.key_hash,
            "key": record.key_text,
            "task_name": record.task_name,
            "overlap": k.cfg.overlap,
            "created_at": self._time(now, times),  # the step's time, in the database's clock
            "updated_at": self._time(now, times),
        }
        for attr, col in FIELDS.items():
            value = getattr(k, attr)
            if value is not None and (attr in TIMES or col in JSON_COLUMNS):
                value = self._time(value, times) if attr in TIMES else self._prep(col, value)
            values[col] = value
        values["state"] = record.state()
        values["counter_id"] = record.counter_id
        values["counter_until"] = self._time(record.counter_until, times)
        values["last_outcome"] = record.last_outcome or ""
        return values

    def _insert(self, cursor: Any, record: Record, now: int, reindex: bool) -> bool:
        """``write`` of a ``blank`` record: its row, with its due entry (on PostgreSQL in
        the same statement)."""
        k = record.key
        values = self._new_row(record, now, {})
        text, params = _insert_text(tuple(values)) + f" RETURNING {q('id')}", list(values.values())
        due = None
        if reindex and k.entry is not None:
            due = [record.key_hash, record.task_name, self._prep("due_at", to_dt(k.entry))]
            if self.pg:  # the entry only when the row was made
                text = f"WITH k AS ({text}), d AS ({UPSERT_DUE_OF_K}) SELECT {q('id')} FROM k"
                params, due = params + due, None
        ends = self._state == "open" and not self._queued  # a step's only write: with COMMIT
        cursor.execute(text + "; COMMIT" if ends else text, params)
        got = cursor.fetchone()
        if ends:
            self._state = "done"  # (a row made meanwhile: nothing was written)
        if got is None:
            return False
        record.pk = got[0]
        if due is not None:
            cursor.execute(UPSERT_DUE, due)
        record.entry = k.entry
        return True

    def _insert_rows(
        self, cursor: Any, table: str, cols: Sequence[str], rows: list[list], tail: str
    ) -> int:
        """Insert ``rows`` (prepared values of ``cols``) into ``table`` (``DebounceKey`` or
        ``DebounceDue``) in as few statements as the database's parameter limit allows: a
        value every row shares is sent once, only the others row by row (an import's
        openings share all but the key and payload). Returns the number of rows inserted."""
        conn = connections[self.alias]
        same = [column.count(column[0]) == len(column) for column in zip(*rows, strict=True)]
        vary = [i for i, s in enumerate(same) if not s] or [0]
        cells, n = [], 0
        for i, col in enumerate(cols):
            cell = "NULL" if same[i] and rows[0][i] is None else "%s"
            if i in vary:
                n += 1
                cell = f"v.column{n}"
            if self.pg:  # VALUES alone would guess text; varchar(n) would cut a long value
                cell = f"CAST({cell} AS {FIELD[col].db_type(conn).partition('(')[0]})"
            cells.append(cell)
        once = [rows[0][i] for i in range(len(cols)) if i not in vary and rows[0][i] is not None]
        width = max(1, ((conn.features.max_query_params or 65535) - len(once)) // len(vary))
        head = f"INSERT INTO {table} ({', '.join(q(c) for c in cols)}) SELECT {', '.join(cells)}"
        made = 0
        for start in range(0, len(rows), width):
            part = rows[start : start + width]
            values = ", ".join(["(" + ", ".join(["%s"] * len(vary)) + ")"] * len(part))
            params = once + [r[i] for r in part for i in vary]
            cursor.execute(f"{head} FROM (VALUES {values}) AS v WHERE true {tail}", params)
            made += cursor.rowcount
        return made

    def write_many(self, records: Sequence[tuple[Record, bool]], now: int) -> bool:
        """``write`` of many records (``(record, reindex)`` pairs): the rows of ``blank``
        records first, in as few statements as ``_insert_rows`` needs, with their due
        entries; then the same statements of the others, each text sent once for all its
        rows (``executemany``, one round trip on PostgreSQL). Returns ``False`` when one of
        the new rows was made meanwhile by another transaction: the caller rolls the
        transaction back and takes the steps again on the rows as they are (the others'
        writes then never happened)."""
        groups: dict[tuple[int, str], list[list]] = {}
        new: list[dict[str, Any]] = []
        due: list[list] = []
        times: dict[int, Any] = {}
        for record, reindex in records:
            self._lost(record)
            if record.pk is None:
                new.append(self._new_row(record, now, times))
                k = record.key
                if reindex and k.entry is not None:
                    due.append([record.key_hash, record.task_name, self._time(k.entry, times)])
                record.entry = k.entry
                continue
            for order, text, params in self._steps(record, now, reindex):
                groups.setdefault((order, text), []).append(params)
        with connections[self.alias].cursor() as cursor:
            if new:
                cols = tuple(new[0])
                rows = [list(v.values()) for v in new]
                made = self._insert_rows(cursor, KEY, cols, rows, NEW_ROW_TAIL)
                if made != len(new):
                    return False
            if due:
                self._insert_rows(cursor, DUE, DUE_COLUMNS, due, UPSERT_DUE_TAIL)
            for (_order, text), many in sorted(groups.items(), key=lambda g: g[0][0]):
                if len(many) == 1:
                    cursor.execute(text, many[0])
                else:
                    cursor.executemany(text, many)
        return True
