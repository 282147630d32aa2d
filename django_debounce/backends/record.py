"""The durable record of keys whose live state is in Redis: the ``DebounceKey`` row (docs/design.md,
"The durable record"; the ``DebounceRun`` rows come from ``recorder.py``).

The Redis store writes a key's row itself only when a flight opens, so that the admin lists
the key and a flight whose Redis state is lost can be rebuilt from it; claims, finishes and
lost runs reach the row through the records the scripts append. Each write is one statement
(an upsert with ``RETURNING`` on PostgreSQL and SQLite, whose text is built once): an opening
trigger must cost little more than a bare ``delay()``. Writes are best effort: Redis has
already committed the step, so a database error is logged and the caller goes on.

``recheck_at`` asks for a comparison with Redis (``RedisBackend.recheck``) one
``DEBOUNCE_DISPATCH_GRACE`` after the key next needs attention, should no later change reach
the row by then.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache, partial
from typing import Any

from django.db import DatabaseError, connections, router

from django_debounce.backends.database_sql import adapt_time
from django_debounce.dbtime import from_db
from django_debounce.dbtime import now as utc_now

logger = logging.getLogger("django_debounce")

US = 1_000_000


def _dt(us: int) -> datetime | None:
    if us <= 0:
        return None
    return datetime.fromtimestamp(us / US, tz=UTC)


def alias() -> str:
    """The database the records are written to (``router.db_for_write(DebounceKey)``)."""
    from django_debounce.models import DebounceKey

    return router.db_for_write(DebounceKey)


def _grace() -> timedelta:
    from django_debounce import conf

    return timedelta(seconds=conf.seconds_of("DISPATCH_GRACE"))


def _recheck(attention: datetime | None) -> datetime | None:
    """When to compare a record with Redis: ``DEBOUNCE_DISPATCH_GRACE`` after the time the key
    next needs attention (by then a claim or finish has normally reached the record)."""
    return attention + _grace() if attention is not None else None


@dataclass
class Opened:
    """The row of a key whose flight opened (from the trigger's reply)."""

    key_hash: str
    key: str
    task_name: str
    at_us: int
    state: str
    pending: int
    flight_id: int
    due_us: int
    payload_json: str | None
    triggers: int
    runs: int
    merged: int
    cancelled: int
    run_id: int


# -- SQL built once per database --------------------------------------------------------

# The columns an opening writes (the others get their field's default); their SQL types.
VARYING = {
    "key": "text",
    "key_hash": "text",
    "task_name": "text",
    "state": "text",
    "pending": "bigint",
    "flight_id": "bigint",
    "first_trigger_at": "timestamptz",
    "last_trigger_at": "timestamptz",
    "due_at": "timestamptz",
    "payload": "jsonb",
    "triggers": "bigint",
    "runs": "bigint",
    "merged": "bigint",
    "cancelled": "bigint",
    "run_id": "bigint",
    "created_at": "timestamptz",
    "updated_at": "timestamptz",
    "recheck_at": "timestamptz",
}
TIMES = {name for name, kind in VARYING.items() if kind == "timestamptz"}

_OPEN_SET = (
    "state", "pending", "flight_id", "first_trigger_at", "last_trigger_at", "due_at", "payload",
    "triggers", "runs", "merged", "cancelled", "run_id", "store", "updated_at", "recheck_at",
)  # fmt: skip


def _supports_upsert(connection: Any) -> bool:
    return connection.vendor in ("postgresql", "sqlite")


def _literal(value: Any, vendor: str) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return ("TRUE" if value else "FALSE") if vendor == "postgresql" else str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for {value!r}")


@cache
def _constants(vendor: str) -> dict[str, str]:
    """The columns an opening does not vary, as SQL literals of their defaults."""
    from django_debounce.models import DebounceKey

    out = {}
    for f in DebounceKey._meta.concrete_fields:
        if f.primary_key or f.column in VARYING:
            continue
        out[f.column] = "'redis'" if f.column == "store" else _literal(f.get_default(), vendor)
    return out


def _insert(vendor: str, table: str, rows: int) -> str:
    """``INSERT INTO table (...) <rows of VARYING values and the constants>``: on PostgreSQL
    one ``SELECT ... FROM unnest(<one array per column>)`` whatever the number of rows (the
    statement's parameters do not grow with it), or one row of scalars; elsewhere a
    ``VALUES`` list."""
    constants = _constants(vendor)
    names = [*VARYING, *constants]
    if vendor == "postgresql" and rows == 1:
        # one row (a single trigger): scalars, cheaper to send than 15 one-element arrays
        one = ", ".join(f"%s::{kind}" for kind in VARYING.values())
        return (
            f"INSERT INTO {table} ({', '.join(names)}) "
            f"VALUES ({one}, {', '.join(constants.values())})"
        )
    if vendor == "postgresql":
        arrays = ", ".join(
            f"%s::{'text' if kind == 'jsonb' else kind}[]" for kind in VARYING.values()
        )
        picked = ", ".join(
            f"v.{name}::jsonb" if kind == "jsonb" else f"v.{name}" for name, kind in VARYING.items()
        )
        return (
            f"INSERT INTO {table} ({', '.join(names)}) "
            f"SELECT {picked}, {', '.join(constants.values())} "
            f"FROM unnest({arrays}) AS v({', '.join(VARYING)})"
        )
    one = "(" + ", ".join(["%s"] * len(VARYING) + list(constants.values())) + ")"
    return f"INSERT INTO {table} ({', '.join(names)}) VALUES {', '.join([one] * rows)}"


def _held_by_database(table: str) -> str:
    """SQL: the row is the live state of a flight or run of the database store (which took
    the key over during a Redis outage): the Redis store's records must not overwrite it,
    or that flight would be lost. Once it is idle, the Redis store takes the row back."""
    return f"({table}.store = 'database' AND {table}.state <> 'idle')"


@cache
def _open_sql(vendor: str, table: str, rows: int) -> str:
    """The upsert of ``rows`` opened flights: a row is brought up to date unless a later
    change reached it first (its ``updated_at``), or the database store holds it; returns the
    key hashes of the rows it wrote."""
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in _OPEN_SET)
    return (
        f"{_insert(vendor, table, rows)} "
        f"ON CONFLICT (key_hash) DO UPDATE SET {sets} "
        f"WHERE {table}.updated_at <= EXCLUDED.updated_at "
        f"AND NOT {_held_by_database(table)} "
        "RETURNING key_hash"
    )


def _seed_insert(table: str) -> str:
    """PostgreSQL: ``INSERT`` of the rows of keys new to Redis that share a task, a time and a
    due time (those of one ``seed_many`` call): only key, key hash and payload vary, so three
    arrays go out instead of one per column (their encoding was most of the client's work).
    Parameters: task name, the time, due time and recheck time, then the three arrays."""
    constants = _constants("postgresql")
    names = [*VARYING, *constants]
    at = "%(at)s::timestamptz"
    values = {
        "key": "v.key",
        "key_hash": "v.key_hash",
        "task_name": "%(task)s::text",
        "state": "'pending'",
        "pending": "1",
        "flight_id": "1",
        "first_trigger_at": at,
        "last_trigger_at": at,
        "due_at": "%(due)s::timestamptz",
        "payload": "v.payload::jsonb",
        "triggers": "1",
        "runs": "0",
        "merged": "0",
        "cancelled": "0",
        "run_id": "0",
        "created_at": at,
        "updated_at": at,
        "recheck_at": "%(recheck)s::timestamptz",
    }
    assert list(values) == list(VARYING)
    return (
        f"INSERT INTO {table} ({', '.join(names)}) "
        f"SELECT {', '.join(values.values())}, {', '.join(constants.values())} "
        "FROM unnest(%(keys)s::text[], %(hashes)s::text[], %(payloads)s::text[]) "
        "AS v(key, key_hash, payload)"
    )


@cache
def _seed_sql(vendor: str, table: str, rows: int = 1, *, compact: bool = False) -> str:
    """The upsert of keys new to Redis, returning the counters each one's Redis state
    continues from (the values before this flight) and a flight whose Redis state was lost.
    ``compact`` (PostgreSQL): the rows of ``_seed_insert``, named parameters."""
    lost = f"({table}.state <> 'idle' AND {table}.store = 'redis')"
    sets = [
        "state = 'pending'",
        f"pending = CASE WHEN {lost} THEN {table}.pending + 1 ELSE 1 END",
        f"flight_id = CASE WHEN {lost} THEN {table}.flight_id ELSE {table}.flight_id + 1 END",
        f"first_trigger_at = CASE WHEN {lost} THEN {table}.first_trigger_at "
        "ELSE EXCLUDED.first_trigger_at END",
        "last_trigger_at = EXCLUDED.last_trigger_at",
        f"due_at = CASE WHEN {lost} THEN {table}.due_at ELSE EXCLUDED.due_at END",
        "payload = EXCLUDED.payload",
        f"triggers = {table}.triggers + 1",
        "store = 'redis'",
        "updated_at = EXCLUDED.updated_at",
        "recheck_at = EXCLUDED.recheck_at",
    ]
    # a row the database store holds is left alone (and returns nothing: see seed_many)
    return (
        f"{_seed_insert(table) if compact else _insert(vendor, table, rows)} "
        f"ON CONFLICT (key_hash) DO UPDATE SET {', '.join(sets)} "
        f"WHERE NOT {_held_by_database(table)} "
        "RETURNING key_hash, run_id, flight_id, triggers, runs, merged, cancelled, pending, "
        "first_trigger_at, due_at"
    )


def _params(connection: Any, rows: list[dict[str, Any]]) -> list[Any]:
    """The parameters of ``_insert``: on PostgreSQL one list per column, elsewhere the values
    row after row (times as the database adapter stores them)."""
    if connection.vendor == "postgresql":
        if len(rows) == 1:
            return [rows[0][name] for name in VARYING]
        return [[row[name] for row in rows] for name in VARYING]
    adapt = partial(adapt_time, connection.ops)
    out: list[Any] = []
    for row in rows:
        out += [adapt(row[name]) if name in TIMES else row[name] for name in VARYING]
    return out


def _row_fields(o: Opened) -> dict[str, Any]:
    """The VARYING columns of the row of ``o`` (the payload as JSON text)."""
    at = _dt(o.at_us)
    due = _dt(o.due_us)
    return {
        "key": o.key,
        "key_hash": o.key_hash,
        "task_name": o.task_name,
        "state": o.state,
        "pending": o.pending,
        "flight_id": o.flight_id,
        "first_trigger_at": at,
        "last_trigger_at": at,
        "due_at": due,
        "payload": o.payload_json,
        "triggers": o.triggers,
        "runs": o.runs,
        "merged": o.merged,
        "cancelled": o.cancelled,
        "run_id": o.run_id,
        "created_at": at,
        "updated_at": at,
        "recheck_at": _recheck(due or at),
    }


# -- writes -----------------------------------------------------------------------------


def seed(
    key_hash: str,
    key: str,
    task_name: str,
    payload_json: str | None,
    due_in: float,
    *,
    at_us: int | None = None,
    held_out: set[str] | None = None,
) -> str:
    """Open the record of a key new to Redis (its state expired while idle, or was lost) and
    return ``"run_id,flight_id,triggers,runs,merged,cancelled,pending,first_us,due_us"``: the
    counters its Redis state continues from, and a flight the record holds whose Redis state
    was lost (this trigger joins it). ``at_us``: the trigger's time in Redis's clock (that of
    every record the recorder writes later; ``None``: this host's). One statement on
    PostgreSQL and SQLite. ``held_out``: as for ``seed_many``."""
    return seed_many(
        [(key_hash, key, task_name, payload_json)], due_in, at_us=at_us, held_out=held_out
    )[key_hash]


def seed_many(
    items: list[tuple[str, str, str, str | None]],
    due_in: float,
    *,
    at_us: int | None = None,
    held_out: set[str] | None = None,
) -> dict[str, str]:
    """``seed`` for each ``(key_hash, key, task_name, payload_json)`` of ``items`` (distinct
    keys), in one statement per 500 keys on PostgreSQL and SQLite. The rows are written at
    ``at_us`` (Redis's clock, as the records of the recorder: a record made before this
    trigger must not count as newer than the row), else at this host's time. The keys whose
    rows the database store holds (left alone) are added to ``held_out`` (the caller marks
    them with ``mark_beside`` once Redis opened their flights)."""
    from django_debounce.models import DebounceKey

    db = alias()
    connection = connections[db]
    now_us = at_us if at_us is not None else int(time.time() * US)
    out: dict[str, str] = {}
    try:
        if _supports_upsert(connection):
            table = DebounceKey._meta.db_table
            due_us = now_us + int(due_in * US)
            if connection.vendor == "postgresql" and len(items) > 1:
                at, due = _dt(now_us), _dt(due_us)
                tasks: dict[str, list[tuple[str, str, str, str | None]]] = defaultdict(list)
                for item in items:
                    tasks[item[2]].append(item)
                sql = _seed_sql("postgresql", table, compact=True)
                for task_name, of_task in tasks.items():
                    for start in range(0, len(of_task), 5000):
                        chunk = of_task[start : start + 5000]
                        params = {
                            "task": task_name,
                            "at": at,
                            "due": due,
                            "recheck": _recheck(due),
                            "keys": [item[1] for item in chunk],
                            "hashes": [item[0] for item in chunk],
                            "payloads": [item[3] for item in chunk],
                        }
                        with connection.cursor() as cursor:
                            cursor.execute(sql, params)
                            returned = cursor.fetchall()
                        for row in returned:
                            out[row[0]] = _seed_of(connection, row[1:])
            else:
                size = 5000 if connection.vendor == "postgresql" else 400
                for start in range(0, len(items), size):
                    chunk = items[start : start + size]
                    rows = [
                        _row_fields(
                            Opened(
                                key_hash, key, task_name, now_us, "pending", 1, 1, due_us,
                                payload_json, 1, 0, 0, 0, 0,
                            )
                        )
                        for key_hash, key, task_name, payload_json in chunk
                    ]  # fmt: skip
                    with connection.cursor() as cursor:
                        cursor.execute(
                            _seed_sql(connection.vendor, table, len(chunk)),
                            _params(connection, rows),
                        )
                        returned = cursor.fetchall()
                    for row in returned:
                        out[row[0]] = _seed_of(connection, row[1:])
            held = [key_hash for key_hash, *_rest in items if key_hash not in out]
            if not held:
                return out  # (an empty filter still costs a query's compilation)
            if held_out is not None:
                held_out.update(held)
            for key_hash, *counters in (
                DebounceKey.objects.using(db)
                .filter(key_hash__in=held)
                .values_list(
                    "key_hash", "run_id", "flight_id", "triggers", "runs", "merged", "cancelled"
                )
            ):
                # the database store holds this key's row: Redis counts from it, no lost flight
                out[key_hash] = ",".join(str(v) for v in counters) + ",0,0,0"
            return out
    except DatabaseError:
        logger.exception("django_debounce: could not record %d keys in the database", len(items))
    for key_hash, *_rest in items:
        row = (
            DebounceKey.objects.using(db)
            .filter(key_hash=key_hash)
            .values_list("run_id", "flight_id", "triggers", "runs", "merged", "cancelled")
            .first()
        )
        out[key_hash] = ",".join(str(v) for v in (row or (0, 0, 0, 0, 0, 0))) + ",0,0,0"
    return out


def _seed_of(connection: Any, row: Any) -> str:
    """The seed string of a row the seed upsert returned (its values after the upsert)."""
    run_id, flight_id, triggers, runs, merged, cancelled, pending, first, due = row
    lost = pending - 1
    first_dt = _as_datetime(connection, first)
    due_dt = _as_datetime(connection, due)
    return ",".join(
        str(v)
        for v in (
            run_id,
            flight_id if lost else flight_id - 1,
            triggers - 1,
            runs,
            merged,
            cancelled,
            lost,
            int(first_dt.timestamp() * US) if lost and first_dt else 0,
            int(due_dt.timestamp() * US) if lost and due_dt else 0,
        )
    )


def _as_datetime(connection: Any, value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        value = connection.ops.convert_datetimefield_value(value, None, connection)
    return from_db(value) if isinstance(value, datetime) else None


def opened(rows: list[Opened]) -> None:
    """Write the rows of keys whose flight opened: created when new, else brought up to date
    unless a later change already reached them. One statement for all of them on PostgreSQL
    and SQLite."""
    if not rows:
        return
    from django_debounce.models import DebounceKey

    db = alias()
    connection = connections[db]
    try:
        if _supports_upsert(connection):
            table = DebounceKey._meta.db_table
            size = 5000 if connection.vendor == "postgresql" else 400
            for start in range(0, len(rows), size):
                chunk = [_row_fields(o) for o in rows[start : start + size]]
                with connection.cursor() as cursor:
                    cursor.execute(
                        _open_sql(connection.vendor, table, len(chunk)), _params(connection, chunk)
                    )
                    written = {row[0] for row in cursor.fetchall()}
                for o in rows[start : start + size]:
                    if o.key_hash not in written:  # a later change, or the database store's
                        mark_beside(db, [o.key_hash], _dt(o.at_us))
            return
        for o in rows:
            fields = _row_fields(o)
            fields["payload"] = json.loads(o.payload_json) if o.payload_json is not None else None
            fields["store"] = "redis"
            at = fields["updated_at"]
            done = (
                DebounceKey.objects.using(db)
                .filter(key_hash=o.key_hash, updated_at__lte=at)
                .update(**{k: fields[k] for k in _OPEN_SET})
            )
            if not done:
                DebounceKey.objects.using(db).bulk_create(
                    [DebounceKey(**fields)], ignore_conflicts=True
                )
                mark_beside(db, [o.key_hash], at)
    except DatabaseError:
        logger.exception("django_debounce: could not record %d opened flights", len(rows))


def mark_beside(db: str, key_hashes: list[str], at: datetime | None) -> None:
    """Redis opened flights at ``at`` (Redis's clock) for keys whose rows the database store
    holds (``_held_by_database``): their records stay the database store's, so each row
    remembers since when Redis holds a flight beside it (``recheck_at``, the latest such time;
    the recorder forgets it when a later record of Redis says the key is idle). When the
    database store's flight ends, the row goes back to Redis (``database._Key.hand_back``)."""
    from django.db.models import F, Value
    from django.db.models.functions import Coalesce, Greatest

    from django_debounce.models import DebounceKey

    if not key_hashes or at is None:
        return
    field = DebounceKey._meta.get_field("recheck_at")
    when = Value(at, output_field=field)
    try:
        DebounceKey.objects.using(db).filter(key_hash__in=key_hashes, store="database").exclude(
            state=DebounceKey.State.IDLE
        ).update(recheck_at=Greatest(Coalesce(F("recheck_at"), when), when))
    except DatabaseError:
        logger.exception("django_debounce: could not mark %d rows beside Redis", len(key_hashes))


def lost_runs(key_hash: str, run_ids: list[int], at_us: int) -> None:
    """Mark the ``DebounceRun`` rows of runs a trigger found lost (their lease ran out)."""
    from django_debounce.models import DebounceRun

    try:
        DebounceRun.objects.using(alias()).filter(
            debounce_key__key_hash=key_hash,
            store="redis",
            run_id__in=run_ids,
            outcome=DebounceRun.Outcome.RUNNING,
        ).update(outcome=DebounceRun.Outcome.LOST, finished_at=_dt(at_us), error="lease ran out")
    except DatabaseError:
        logger.exception("django_debounce: could not record lost runs of %s", key_hash)


def synced(row: Any, pending: int, running_until: int, due: int) -> None:
    """Bring the record ``row`` of a key Redis holds up to its live state (pending count,
    state, due time) and set its next recheck."""
    from django_debounce.models import DebounceKey

    state = (
        DebounceKey.State.RUNNING
        if running_until
        else DebounceKey.State.PENDING
        if pending
        else DebounceKey.State.IDLE
    )
    attention = _dt(running_until) if running_until else _dt(due) if pending else None
    DebounceKey.objects.using(alias()).filter(pk=row.pk).update(
        state=state,
        pending=pending,
        due_at=_dt(due) if pending else None,
        running_until=_dt(running_until),
        recheck_at=_recheck(attention),
    )


def rechecked(row: Any, at: datetime | None = None) -> None:
    """The flight of ``row`` was rebuilt in Redis at ``at`` (the recheck's time; ``None``:
    now): look again one grace later."""

    from django_debounce.models import DebounceKey

    DebounceKey.objects.using(alias()).filter(pk=row.pk).update(
        recheck_at=_recheck(at or utc_now())
    )


def recheck_later(key_hash: str) -> None:
    """Ask for a recheck of the record of ``key_hash`` one ``DEBOUNCE_DISPATCH_GRACE`` from now
    (a run of the previous release is live: its flight is adopted after it)."""

    from django_debounce.models import DebounceKey

    DebounceKey.objects.using(alias()).filter(key_hash=key_hash).update(
        recheck_at=_recheck(utc_now())
    )


def update_rows(db: str, model: Any, fields: list[str], rows: list[tuple[Any, ...]]) -> None:
    """Set ``fields`` of the ``model`` rows named by primary key, each to its own values, in
    one statement per 500 rows: ``rows`` holds ``(pk, *values in the order of fields)``.

    What ``QuerySet.bulk_update`` does, without its cost: ``bulk_update`` builds a ``CASE
    WHEN pk = ... THEN ...`` expression per field and row, and compiling it took the
    recorder ~2 ms per run (``bench/results/scale.md``, "Profiles"). On PostgreSQL this is
    one ``UPDATE ... FROM unnest(<one array per column>)`` (its parameters do not grow with
    the rows), on SQLite an ``UPDATE ... FROM`` a ``VALUES`` list (SQLite 3.33 or later);
    other databases get ``bulk_update``. Values are prepared by the model's fields
    (``get_db_prep_value``), so times follow ``USE_TZ`` as the ORM's would.

    Raises ``DatabaseError`` as the database does; runs in the caller's transaction."""
    if not rows:
        return
    connection = connections[db]
    vendor = connection.vendor
    pk = model._meta.pk
    columns = [model._meta.get_field(name) for name in fields]
    if vendor not in ("postgresql", "sqlite"):
        objects = []
        for row in rows:
            obj = model(pk=row[0])
            for field, value in zip(columns, row[1:], strict=True):
                setattr(obj, field.attname, value)
            objects.append(obj)
        model.objects.using(db).bulk_update(objects, fields)
        return
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    names = ["pk__", *(f"v{i}" for i in range(len(columns)))]
    sets = ", ".join(f"{quote(f.column)} = v.v{i}" for i, f in enumerate(columns))
    prep = [
        (lambda v, f=f: f.get_db_prep_value(v, connection, prepared=False)) for f in [pk, *columns]
    ]
    with connection.cursor() as cursor:
        for start in range(0, len(rows), 500):
            chunk = rows[start : start + 500]
            values = [[p(v) for p, v in zip(prep, row, strict=True)] for row in chunk]
            if vendor == "postgresql":
                kinds = [
                    f.cast_db_type(connection) or f.db_type(connection) for f in [pk, *columns]
                ]
                arrays = ", ".join(f"%s::{kind}[]" for kind in kinds)
                sql = (
                    f"UPDATE {table} SET {sets} FROM unnest({arrays}) AS v({', '.join(names)}) "
                    f"WHERE {table}.{quote(pk.column)} = v.pk__"
                )
                params: list[Any] = [list(col) for col in zip(*values, strict=True)]
            else:
                one = "(" + ", ".join(["%s"] * len(names)) + ")"
                sql = (
                    f"WITH v({', '.join(names)}) AS (VALUES {', '.join([one] * len(chunk))}) "
                    f"UPDATE {table} SET {sets} FROM v WHERE {table}.{quote(pk.column)} = v.pk__"
                )
                params = [v for row in values for v in row]
            cursor.execute(sql, params)
