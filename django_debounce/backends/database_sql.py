"""SQL of the database store (``database.py``): the column map of a key's state, statement
texts, and the writer that sends the writes of one step (or of one batch of the pump) as one
statement on PostgreSQL (data-modifying ``WITH`` parts) and one by one on SQLite.

Raw SQL, not the ORM: compiling a query costs about 170 us, more than a short statement takes
on a local PostgreSQL. Texts depend only on the vendor and the shape of the writes (which
columns, how many rows), and are kept once built.

Times are integer microseconds since the epoch in the store (as in ``django_debounce/machine.py``) and
aware datetimes in the database: PostgreSQL ``timestamptz`` and SQLite's text as Django writes
it (``connection.ops.adapt_datetimefield_value``), so the ORM reads the same values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django_debounce.dbtime import from_db, to_db
from django_debounce.models import DebounceDue, DebounceKey, DebounceRun

KEY = DebounceKey._meta.db_table
DUE = DebounceDue._meta.db_table
RUN = DebounceRun._meta.db_table

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)

# Kinds of columns, named by their PostgreSQL type (the element type of a batch's arrays).
INT, BOOL, TIME, JSON, STR = "bigint", "boolean", "timestamptz", "jsonb", "text"

# The state of a key: attribute of database._Key (named as in django_debounce/machine.py's KeyModel),
# column of DebounceKey, kind. Read in this order after HEAD.
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("pending", "pending", INT),
    ("flight_id", "flight_id", INT),
    ("first", "first_trigger_at", TIME),
    ("last", "last_trigger_at", TIME),
    ("anchor", "anchor_at", TIME),
    ("bound", "bound_at", TIME),
    ("due", "due_at", TIME),
    ("payload", "payload", JSON),
    ("due_fixed", "due_fixed", BOOL),
    ("attempt", "attempt", INT),
    ("attempted", "attempted", INT),
    ("not_before", "not_before", TIME),
    ("seq", "scheduled_seq", INT),
    ("taken", "scheduled", BOOL),
    ("taken_at", "scheduled_at", TIME),
    ("run_id", "run_id", INT),
    ("run_seq", "run_seq", INT),
    ("running_until", "running_until", TIME),
    ("run_triggers", "run_triggers", INT),
    ("run_payload", "run_payload", JSON),
    ("run_first", "run_first_trigger_at", TIME),
    ("run_anchor", "run_anchor_at", TIME),
    ("run_bound", "run_bound_at", TIME),
    ("run_attempted", "run_attempted", INT),
    ("run_attempt", "run_attempt", INT),
    ("last_run_at", "last_run_at", TIME),
    ("triggers", "triggers", INT),
    ("runs", "runs", INT),
    ("merged", "merged", INT),
    ("cancelled", "cancelled", INT),
    ("overlap", "overlap", BOOL),
    ("state", "state", STR),
    ("store", "store", STR),
    ("last_outcome", "last_outcome", STR),
    # a row the database store holds: since when Redis may hold a flight of the key that this
    # row does not record ("Failover", docs/design.md); a row Redis holds: its next recheck
    ("beside", "recheck_at", TIME),
    ("updated", "updated_at", TIME),  # read only: every step writes it (the step's time)
)
HEAD = ("id", "key_hash", "key", "task_name")
# Kinds of the other columns a step may write.
KINDS: dict[str, str] = {c: kind for _a, c, kind in FIELDS}
KINDS.update({"created_at": TIME, "watchdog_at": TIME, "merge_until": TIME})

RUN_COLUMNS = (
    "debounce_key_id",
    "task_name",
    "store",
    "flight_id",
    "run_id",
    "attempt",
    "triggers",
    "first_trigger_at",
    "last_trigger_at",
    "due_at",
    "started_at",
    "delay",
    "outcome",
    "error",
)


def q(name: str) -> str:
    """A quoted identifier (the same in PostgreSQL and SQLite)."""
    return f'"{name}"'


def columns(prefix: str = "") -> str:
    """The select list of a key's state: HEAD then FIELDS."""
    return ", ".join(prefix + q(c) for c in (*HEAD, *(c for _a, c, _k in FIELDS)))


def to_us(value: datetime | str | None) -> int | None:
    """Microseconds since the epoch of a database time (naive values are in
    ``dbtime.db_zone()``: UTC, or ``TIME_ZONE`` under ``USE_TZ = False``)."""
    at = from_db(value)
    if at is None:
        return None
    return (at - EPOCH) // ONE_US


def adapt_time(ops: Any, value: datetime) -> Any:
    """``value`` (aware) as the database adapter stores it under either ``USE_TZ``."""
    return ops.adapt_datetimefield_value(to_db(value))


def to_dt(us: int | None) -> datetime | None:
    """The aware UTC datetime of ``us`` microseconds since the epoch."""
    if us is None:
        return None
    return EPOCH + timedelta(microseconds=us)


@dataclass
class Writes:
    """The writes of one step, or of one batch of the pump, as database parameters.

    ``keys``: ``(pk, columns, values)`` of key rows; ``index``: ``(key_hash, task_name,
    due_at)`` entries to put; ``unindex``: key hashes whose entry goes; ``runs_new``: values
    of RUN_COLUMNS; ``runs_end``: ``(key pk, run id, outcome, finished_at, error)`` of run
    records still marked running.
    """

    keys: list[tuple[int, tuple[str, ...], list[Any]]] = field(default_factory=list)
    index: list[tuple[str, str, Any]] = field(default_factory=list)
    unindex: list[str] = field(default_factory=list)
    runs_new: list[list[Any]] = field(default_factory=list)
    runs_end: list[tuple[int, int, str, Any, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Opening:
    """The row a trigger makes for a key that has none (``database._opening``), as a function
    of the statement's clock: ``columns`` are ``(column, how, value)``, how ``"const"`` (value
    a literal), ``"now"`` (the clock plus value microseconds) or ``"param"`` (value names the
    call's own: ``key``, ``kh``, ``task`` or ``payload``); ``entry``: its index entry, in
    microseconds after the clock; ``countdown``: its message's (``None``: none)."""

    columns: tuple[tuple[str, str, Any], ...]
    entry: int
    countdown: int | None


class Sql:
    """Statement texts of one vendor (``postgresql`` or anything else, taken as SQLite's
    dialect), built once per shape."""

    def __init__(self, vendor: str, adapt_time: Callable[[datetime], Any]) -> None:
        self.pg = vendor == "postgresql"
        self._adapt = adapt_time
        self._texts: dict[Any, str] = {}
        cols = columns()
        lock = " FOR UPDATE" if self.pg else ""
        clock = "clock_timestamp()" if self.pg else "NULL"
        self.select_key = f"SELECT {clock}, {cols} FROM {q(KEY)} WHERE {q('key_hash')} = %s{lock}"
        new = [f for f in DebounceKey._meta.concrete_fields if not f.null and not f.primary_key]
        self._new_fields = new
        self.insert_key = (
            f"INSERT INTO {q(KEY)} ({', '.join(q(f.column) for f in new)})"
            f" VALUES ({', '.join(['%s'] * len(new))}) ON CONFLICT ({q('key_hash')}) DO NOTHING"
        )
        # PostgreSQL: make the row if there is none and lock and read it, in one statement.
        # The insert's RETURNING gives a new row; the sub-select (the snapshot before the
        # insert) an existing one, locked. A row another transaction made and committed after
        # this statement began is in neither: the caller reads it with select_key.
        self.insert_or_select_key = (
            f"WITH ins AS ({self.insert_key} RETURNING clock_timestamp(), {cols})"
            " SELECT * FROM ins UNION ALL SELECT * FROM ("
            f"SELECT clock_timestamp(), {cols} FROM {q(KEY)} WHERE {q('key_hash')} = %s"
            " FOR UPDATE) AS s"
        )
        # SQLite: a first statement that writes (and changes nothing) takes the database's
        # write lock at once, waiting with the busy timeout, when transactions are DEFERRED.
        self.write_lock = f"UPDATE {q(DUE)} SET {q('due_at')} = {q('due_at')} WHERE 0"
        self.upsert_due = (
            f"INSERT INTO {q(DUE)} ({q('key_hash')}, {q('task_name')}, {q('due_at')})"
            " VALUES (%s, %s, %s)"
            f" ON CONFLICT ({q('key_hash')}) DO UPDATE SET {q('due_at')} = excluded.{q('due_at')},"
            f" {q('task_name')} = excluded.{q('task_name')}"
            f" WHERE {q(DUE)}.{q('due_at')} <> excluded.{q('due_at')}"
            f" OR {q(DUE)}.{q('task_name')} <> excluded.{q('task_name')}"
        )
        self.delete_due = f"DELETE FROM {q(DUE)} WHERE {q('key_hash')} = %s"
        self.insert_run = (
            f"INSERT INTO {q(RUN)} ({', '.join(q(c) for c in RUN_COLUMNS)})"
            f" VALUES ({', '.join(['%s'] * len(RUN_COLUMNS))}) ON CONFLICT DO NOTHING"
        )
        self.end_run = (
            f"UPDATE {q(RUN)} SET {q('outcome')} = %s, {q('finished_at')} = %s, {q('error')} = %s"
            f" WHERE {q('debounce_key_id')} = %s AND {q('store')} = 'database'"
            f" AND {q('run_id')} = %s AND {q('outcome')} = 'running'"
        )

    def insert_keys(self, n: int) -> str:
        """``insert_key`` of ``n`` rows (parameters: ``new_key``'s, row after row)."""
        text = self._texts.get(("insert_keys", n))
        if text is None:
            one = "(" + ", ".join(["%s"] * len(self._new_fields)) + ")"
            text = self._texts["insert_keys", n] = self.insert_key.replace(
                f"VALUES {one}", f"VALUES {', '.join([one] * n)}"
            )
        return text

    def select_keys(self, n: int) -> str:
        """``select_key`` of ``n`` key hashes, without the clock, in key-hash order
        (parameters: ``names_param``)."""
        text = self._texts.get(("select_keys", 0 if self.pg else n))
        if text is None:
            where = "= ANY(%s)" if self.pg else f"IN ({self.names(n)})"
            lock = " FOR UPDATE" if self.pg else ""
            text = self._texts["select_keys", 0 if self.pg else n] = (
                f"SELECT {columns()} FROM {q(KEY)} WHERE {q('key_hash')} {where}"
                f" ORDER BY {q('key_hash')}{lock}"
            )
        return text

    def names_param(self, values: list[str]) -> list[Any]:
        """The parameters of an ``= ANY(%s)`` (PostgreSQL) or ``IN (...)`` list."""
        return [values] if self.pg else list(values)

    # -- values ------------------------------------------------------------------------

    def time(self, us: int | None) -> Any:
        """The database parameter of a time in microseconds."""
        return None if us is None else self._adapt(EPOCH + timedelta(microseconds=us))

    def new_key(self, key: str, key_hash: str, task_name: str, now: int) -> list[Any]:
        """Parameters of ``insert_key``: a row at the model defaults."""
        at = self.time(now)
        given = {"key": key, "key_hash": key_hash, "task_name": task_name}
        out = []
        for f in self._new_fields:
            if f.name in given:
                out.append(given[f.name])
            elif f.name in ("created_at", "updated_at"):
                out.append(at)
            else:
                out.append(f.get_default())
        return out

    def names(self, n: int) -> str:
        """``%s`` placeholders of an ``IN`` list of ``n`` values (SQLite)."""
        return ", ".join(["%s"] * n)

    # -- the merge hot path (PostgreSQL) ----------------------------------------------------

    def merge(self, given_now: bool, opening: Opening | None = None) -> str:
        """A trigger that only joins the open flight (``KeyModel.is_plain_merge``; the caller
        excludes collect mode) in one ``UPDATE ... RETURNING``. Twin of the hot path of
        trigger.lua: the due time moves later only, the index entry stays, and no indexed
        column changes (PostgreSQL updates the row in place, HOT). Parameters: [now,] payload,
        wait_us, max_wait_us (None: no max_wait), key_hash; with ``opening``, then key and
        task name.

        With ``opening``, a key that has no row gets it in the same statement, its flight
        opened, and its index entry (``INSERT ... SELECT ... WHERE NOT EXISTS`` the merge, ``ON
        CONFLICT DO NOTHING``): a new key costs one statement, as a merge does. Rows: (merged,
        flight id, pending, due time, sequence number of the opening's message); none when
        the key has a row the merge leaves alone (the caller takes the locked step)."""
        text = self._texts.get(("merge", given_now, opening))
        if text is None:
            now = "%s::timestamptz" if given_now else "STATEMENT_TIMESTAMP()"
            us = "::bigint * INTERVAL '1 microsecond'"
            # the flight's max_wait bound: the smallest anchor + max_wait among its triggers
            # (LEAST and GREATEST skip NULLs: no bound, no backoff)
            bound = (
                "(CASE WHEN c.mw IS NULL THEN k.bound_at ELSE LEAST(k.bound_at,"
                f" COALESCE(k.anchor_at, k.first_trigger_at) + c.mw{us}) END)"
            )
            given = (
                f"SELECT {now} AS now, %s::text AS payload, %s::bigint AS wait, %s::bigint AS mw"
            )
            update = (
                f"UPDATE {q(KEY)} AS k SET pending = k.pending + 1, triggers = k.triggers + 1,"
                " last_trigger_at = c.now, payload = c.payload::jsonb,"
                f" bound_at = {bound},"
                " due_at = GREATEST(CASE WHEN k.due_fixed THEN k.due_at ELSE GREATEST(k.due_at,"
                f" LEAST(c.now + c.wait{us}, {bound})) END, k.not_before)"
                " FROM {c} WHERE k.key_hash = {kh} AND k.store = 'database' AND k.pending > 0"
                " AND (k.running_until IS NULL OR k.running_until > c.now)"
                " RETURNING k.flight_id, k.pending, k.due_at"
            )
            if opening is None:
                text = update.format(c=f"({given}) AS c", kh="%s")
            else:
                cols = ", ".join(q(c) for c, _how, _v in opening.columns)
                exprs = ", ".join(self._opening_expr(c, how, v) for c, how, v in opening.columns)
                text = (
                    f"WITH c AS ({given}, %s::text AS kh, %s::text AS key, %s::text AS task),"
                    f" m AS ({update.format(c='c', kh='c.kh')}),"
                    f" o AS (INSERT INTO {q(KEY)} ({cols}) SELECT {exprs} FROM c"
                    " WHERE NOT EXISTS (SELECT 1 FROM m) ON CONFLICT (key_hash) DO NOTHING"
                    " RETURNING flight_id, pending, due_at, scheduled_seq, key_hash, task_name,"
                    " updated_at),"
                    f" d AS (INSERT INTO {q(DUE)} (key_hash, task_name, due_at)"
                    f" SELECT key_hash, task_name, updated_at + {opening.entry}{us} FROM o"
                    " ON CONFLICT (key_hash) DO UPDATE SET due_at = excluded.due_at,"
                    " task_name = excluded.task_name)"
                    " SELECT TRUE, flight_id, pending, due_at, 0::bigint FROM m"
                    " UNION ALL SELECT FALSE, flight_id, pending, due_at, scheduled_seq FROM o"
                )
            self._texts["merge", given_now, opening] = text
        return text

    @staticmethod
    def _opening_expr(column: str, how: str, value: Any) -> str:
        """The value of ``column`` in a new key's row (``Opening``), from the statement's
        ``c``: the clock, the call's own values, or a literal."""
        kind = KINDS.get(column, STR)
        if how == "now":  # the clock plus value microseconds
            if kind == TIME:
                return f"c.now + {int(value)}::bigint * INTERVAL '1 microsecond'"
            return f"(round(extract(epoch FROM c.now) * 1000000)::bigint + {int(value)})"
        if how == "param":  # key, kh, task or payload
            return "c.payload::jsonb" if value == "payload" else f"c.{value}"
        if value is None:
            return f"NULL::{kind}"
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        if isinstance(value, int):
            return f"{value}::bigint"
        if isinstance(value, str) and kind == STR:
            return "'" + value.replace("'", "''") + "'::text"
        raise ValueError(f"no literal for {column} = {value!r}")

    # -- the pump --------------------------------------------------------------------------

    def take(self, n_tasks: int) -> str:
        """Lock and read due entries and their keys. PostgreSQL: per task, the first due
        entries in index order, ``FOR UPDATE OF`` entry and key ``SKIP LOCKED`` (pumps never
        wait for each other nor take one entry twice; a key another step holds is left for the
        next take); SQLite: the transaction holds the database's write lock. Parameters:
        PostgreSQL [task names, now, limit, limit], SQLite [*task names, now, limit]. Rows:
        entry's task, entry's time, then the key's state (``columns()``)."""
        text = self._texts.get(("take", 0 if self.pg else n_tasks))
        if text is None:
            cols = columns("k.")
            if self.pg:
                text = (
                    "SELECT x.* FROM unnest(%s::text[]) AS t(name) CROSS JOIN LATERAL ("
                    f" SELECT d.task_name AS entry_task, d.due_at AS entry, {cols}"
                    f" FROM {q(DUE)} AS d JOIN {q(KEY)} AS k ON k.key_hash = d.key_hash"
                    " WHERE d.task_name = t.name AND d.due_at <= %s"
                    " ORDER BY d.due_at LIMIT %s FOR UPDATE OF d, k SKIP LOCKED) AS x"
                    " ORDER BY x.entry LIMIT %s"
                )
            else:
                text = (
                    f"SELECT d.task_name, d.due_at, {cols}"
                    f" FROM {q(DUE)} AS d JOIN {q(KEY)} AS k ON k.key_hash = d.key_hash"
                    f" WHERE d.task_name IN ({self.names(n_tasks)}) AND d.due_at <= %s"
                    " ORDER BY d.due_at LIMIT %s"
                )
            self._texts["take", 0 if self.pg else n_tasks] = text
        return text

    def first_entry(self, n_tasks: int, *, excluding: bool = False) -> str:
        """The earliest entry of some tasks, and the clock (PostgreSQL). Parameters:
        PostgreSQL [task names(, key hashes left out)], SQLite [*task names]."""
        text = self._texts.get(("first", n_tasks if not self.pg else 0, excluding))
        if text is None:
            if self.pg:
                # one index probe per task (task_name, due_at)
                skip = " AND NOT (d.key_hash = ANY(%s))" if excluding else ""
                text = (
                    "SELECT min(x.m), clock_timestamp() FROM unnest(%s::text[]) AS t(name)"
                    f" CROSS JOIN LATERAL (SELECT d.due_at AS m FROM {q(DUE)} AS d"
                    f" WHERE d.task_name = t.name{skip} ORDER BY d.due_at LIMIT 1) AS x"
                )
            else:
                text = (
                    f"SELECT min({q('due_at')}), NULL FROM {q(DUE)}"
                    f" WHERE {q('task_name')} IN ({self.names(n_tasks)})"
                )
            self._texts["first", n_tasks if not self.pg else 0, excluding] = text
        return text

    def orphans(self, n_tasks: int) -> str:
        """Delete due entries of keys whose row is gone (purged): no take would ever find
        them, and the pump would see them due forever. Parameters: task names, a time a
        second before now: an entry a trigger writes again while this runs (the key made
        anew) is newer, so the recheck of the row this waits for leaves it."""
        names = "= ANY(%s)" if self.pg else f"IN ({self.names(n_tasks)})"
        return (
            f"DELETE FROM {q(DUE)} WHERE {q('task_name')} {names} AND {q('due_at')} <= %s"
            f" AND NOT EXISTS (SELECT 1 FROM {q(KEY)} AS k WHERE k.key_hash = {q(DUE)}.key_hash)"
        )

    def extend(self, given_now: bool) -> str:
        """The lease keeper's batch in one statement (PostgreSQL): each live run claimed by
        message ``seq`` gets ``now + lease``, and its key's entry moves to its attention time
        (``KeyModel._attention``: the lease end, or the overlapping flight's time when
        earlier). Twin of extend.lua and KeyModel.extend. Parameters: [now,] key hashes,
        seqs, leases in us, overlaps, retake_us. Rows: key hash, seq, lease end, now."""
        text = self._texts.get(("extend", given_now))
        if text is None:
            now = "%s::timestamptz" if given_now else "clock_timestamp()"
            us = "::bigint * INTERVAL '1 microsecond'"
            text = self._texts["extend", given_now] = (
                f"WITH c AS MATERIALIZED (SELECT {now} AS now),"
                " v AS (SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[],"
                " %s::boolean[]) AS v(key_hash, seq, lease, overlap)),"
                f" u AS (UPDATE {q(KEY)} AS k SET running_until = c.now + v.lease{us}"
                " FROM v, c WHERE k.key_hash = v.key_hash AND k.store = 'database'"
                " AND v.seq > 0 AND k.run_seq = v.seq AND k.running_until > c.now"
                " RETURNING k.key_hash, k.task_name, k.run_seq, k.running_until,"
                " CASE WHEN k.pending > 0 AND v.overlap THEN CASE WHEN k.scheduled"
                f" THEN k.scheduled_at + %s{us} ELSE k.due_at END END AS flight),"
                f" i AS (INSERT INTO {q(DUE)} (key_hash, task_name, due_at)"
                " SELECT key_hash, task_name, LEAST(running_until, flight) FROM u"
                " ON CONFLICT (key_hash) DO UPDATE SET due_at = excluded.due_at,"
                " task_name = excluded.task_name)"
                " SELECT u.key_hash, u.run_seq, u.running_until, c.now FROM u, c"
            )
        return text

    # -- writes ------------------------------------------------------------------------------

    def _update_one(self, cols: tuple[str, ...]) -> str:
        text = self._texts.get(("update", cols))
        if text is None:
            sets = ", ".join(
                f"{q(c)} = %s::jsonb" if self.pg and KINDS[c] == JSON else f"{q(c)} = %s"
                for c in cols
            )
            text = self._texts["update", cols] = f"UPDATE {q(KEY)} SET {sets} WHERE id = %s"
        return text

    def _update_many(self, cols: tuple[str, ...]) -> str:
        text = self._texts.get(("updates", cols))
        if text is None:
            sets = ", ".join(f"{q(c)} = v.{q(c)}" for c in cols)
            arrays = ", ".join(["%s::bigint[]", *(f"%s::{KINDS[c]}[]" for c in cols)])
            names = ", ".join(["id", *(q(c) for c in cols)])
            text = self._texts["updates", cols] = (
                f"UPDATE {q(KEY)} AS k SET {sets} FROM unnest({arrays}) AS v({names})"
                " WHERE k.id = v.id"
            )
        return text

    def parts(self, w: Writes) -> list[tuple[str, list[Any], bool]]:
        """The statements of ``w``: ``(text, parameters, many)``; ``many``: parameters is a
        list of rows for ``executemany`` (SQLite only)."""
        out: list[tuple[str, list[Any], bool]] = []
        groups: dict[tuple[str, ...], list[tuple[int, list[Any]]]] = {}
        for pk, cols, values in w.keys:
            groups.setdefault(cols, []).append((pk, values))
        for cols, rows in groups.items():
            if len(rows) == 1:
                pk, values = rows[0]
                out.append((self._update_one(cols), [*values, pk], False))
            elif self.pg:
                arrays: list[Any] = [[pk for pk, _v in rows]]
                arrays += [[v[i] for _pk, v in rows] for i in range(len(cols))]
                out.append((self._update_many(cols), arrays, False))
            else:
                out.append((self._update_one(cols), [[*v, pk] for pk, v in rows], True))
        if w.index:
            if len(w.index) == 1:
                out.append((self.upsert_due, list(w.index[0]), False))
            elif self.pg:
                text = self.upsert_due.replace(
                    "VALUES (%s, %s, %s)",
                    "SELECT * FROM unnest(%s::text[], %s::text[], %s::timestamptz[])",
                )
                out.append((text, [list(col) for col in zip(*w.index, strict=True)], False))
            else:
                out.append((self.upsert_due, [list(r) for r in w.index], True))
        if w.unindex:
            if len(w.unindex) == 1:
                out.append((self.delete_due, [w.unindex[0]], False))
            elif self.pg:
                text = f"DELETE FROM {q(DUE)} WHERE {q('key_hash')} = ANY(%s)"
                out.append((text, [list(w.unindex)], False))
            else:
                out.append((self.delete_due, [[h] for h in w.unindex], True))
        for values in w.runs_new:
            out.append((self.insert_run, values, False))
        if w.runs_end:
            if len(w.runs_end) == 1 or not self.pg:
                rows_end = [[o, at, e, pk, rid] for pk, rid, o, at, e in w.runs_end]
                if len(rows_end) == 1:
                    out.append((self.end_run, rows_end[0], False))
                else:
                    out.append((self.end_run, rows_end, True))
            else:
                text = (
                    f"UPDATE {q(RUN)} AS r SET outcome = v.outcome, finished_at = v.at,"
                    " error = v.error FROM unnest(%s::bigint[], %s::bigint[], %s::text[],"
                    " %s::timestamptz[], %s::text[]) AS v(kid, rid, outcome, at, error)"
                    " WHERE r.debounce_key_id = v.kid AND r.store = 'database'"
                    " AND r.run_id = v.rid AND r.outcome = 'running'"
                )
                out.append((text, [list(col) for col in zip(*w.runs_end, strict=True)], False))
        return out

    @property
    def run_triggers(self) -> str:
        """Set the triggers a run covered (a give-up covers only the attempted ones).
        Parameters: triggers, key pk, run id."""
        return (
            f"UPDATE {q(RUN)} SET triggers = %s WHERE debounce_key_id = %s"
            " AND store = 'database' AND run_id = %s"
        )

    def run(self, cursor: Any, w: Writes, final: tuple[str, Sequence[Any]] | None = None) -> Any:
        """Send the writes of ``w``, then ``final`` (a query whose first row is returned).
        PostgreSQL: one statement, the writes as ``WITH`` parts of ``final`` (or of the last
        write); their rows are distinct, and ``final`` reads the snapshot before them.
        SQLite: one statement each, in order; ``final`` sees the writes."""
        parts = self.parts(w)
        if self.pg:
            if final is not None:
                parts.append((final[0], list(final[1]), False))
            if not parts:
                return None
            *ahead, (text, params, _many) = parts
            if ahead:
                text = (
                    "WITH "
                    + ", ".join(f"w{i} AS ({t})" for i, (t, _p, _m) in enumerate(ahead))
                    + " "
                    + text
                )
                params = [p for _t, ps, _m in ahead for p in ps] + params
            cursor.execute(text, params)
            return cursor.fetchone() if final is not None else None
        for text, params, many in parts:
            if many:
                cursor.executemany(text, params)
            else:
                cursor.execute(text, params)
        if final is not None:
            cursor.execute(final[0], final[1])
            return cursor.fetchone()
        return None
