"""The SQL behind the admin summary (``summary.py``): percentiles of the trigger-to-start delay
per task (interpolated as PostgreSQL's ``percentile_cont``) and time-bucket counts of the run
history, computed in the database (docs/design.md, "Models, admin, commands and signals")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any

from django.db import OperationalError, connections
from django.db.models import Aggregate, FloatField, Func, IntegerField

from django_debounce.dbtime import to_db
from django_debounce.models import DebounceRun


def adapt_time(ops: Any, value: datetime) -> Any:
    """``value`` (aware) as the database adapter stores it under either ``USE_TZ``."""
    return ops.adapt_datetimefield_value(to_db(value))


# Created on SQLite only, by migration 0001 (the other databases never use it).
SQLITE_DELAY_INDEX = "debounce_run_task_delay"
# SQLite allows at most 500 terms in one compound SELECT.
SQLITE_MAX_TERMS = 500
PARAMS_PER_TERM = 8
# Runs whose triggers a later run covers again (as summary.REDONE).
REDONE = (DebounceRun.Outcome.LOST, DebounceRun.Outcome.RETRY)


class PercentileCont(Aggregate):
    """PostgreSQL's ordered-set aggregate ``percentile_cont(fraction) WITHIN GROUP (ORDER BY x)``
    (continuous percentile, linear interpolation between the two nearest values)."""

    function = "PERCENTILE_CONT"
    name = "PercentileCont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, fraction: float) -> None:
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction must be between 0 and 1, got {fraction!r}")
        # No filter=: the template has no place for it (use a CASE; NULLs are skipped).
        super().__init__(expression, fraction=repr(float(fraction)))


class Bucket(Func):
    """Index of the fixed-width time bucket a datetime falls in, in PostgreSQL:
    ``floor((epoch seconds - origin) / width)``."""

    output_field = IntegerField()

    def __init__(self, expression: Any, origin: int, width: int) -> None:
        super().__init__(expression)
        self.origin, self.width = int(origin), int(width)

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.source_expressions[0])
        # date_part is double precision; EXTRACT is numeric since PostgreSQL 14, and slower.
        epoch = "FLOOR((date_part('epoch', {}) - %s) / %s)::bigint"
        return epoch.format(sql), [*params, self.origin, self.width]


def percentile_positions(n: int, fraction: float) -> tuple[int, int, float]:
    """1-based row numbers of the two values around the ``fraction`` percentile of ``n``
    sorted values, and the interpolation weight of the upper one (as ``percentile_cont``)."""
    index = (n - 1) * fraction
    low = math.floor(index)
    return low + 1, min(low + 2, n), index - low


def _interpolate(values: Sequence[float], weight: float) -> float:
    low, high = min(values), max(values)
    return low + (high - low) * weight


def offset_percentiles(
    alias: str,
    since: datetime,
    until: datetime,
    counts: dict[str, int],
    fractions: Sequence[float],
) -> dict[str, dict[float, float]]:
    """Percentiles of ``delay`` per task, each read with ``ORDER BY delay LIMIT 2 OFFSET k``
    from the nearer end (on SQLite through the index ``(task, delay, started_at, outcome)``,
    so nothing is sorted); every percentile of every task in one statement.
    ``counts`` is the number of runs (lost and retried ones excluded) of each wanted task in
    the period.
    Returns ``{task: {fraction: seconds}}``."""
    connection = connections[alias]
    qn = connection.ops.quote_name
    table = qn(DebounceRun._meta.db_table)
    hint = f" INDEXED BY {qn(SQLITE_DELAY_INDEX)}" if connection.vendor == "sqlite" else ""
    bounds = [adapt_time(connection.ops, t) for t in (since, until)]
    terms: list[str] = []
    params: list[Any] = []
    wanted: list[tuple[str, float, float]] = []
    for name, n in counts.items():
        if not n:
            continue
        for fraction in fractions:
            low, high, weight = percentile_positions(n, fraction)
            ascending = low - 1 <= n - high
            offset = low - 1 if ascending else n - high
            terms.append(
                f"SELECT %s AS {qn('term')}, {qn('delay')} FROM (SELECT {qn('delay')} "
                f"FROM {table}{hint} WHERE {qn('task_name')} = %s AND {qn('started_at')} >= %s "
                f"AND {qn('started_at')} < %s AND {qn('outcome')} NOT IN (%s, %s) "
                f"ORDER BY {qn('delay')} {'ASC' if ascending else 'DESC'} LIMIT %s OFFSET %s) "
                f"{qn('t' + str(len(terms)))}"
            )
            params += [len(wanted), name, *bounds, *REDONE, high - low + 1, offset]
            wanted.append((name, fraction, weight))
    found: dict[int, list[float]] = {}
    for start in range(0, len(terms), SQLITE_MAX_TERMS):
        chunk = terms[start : start + SQLITE_MAX_TERMS]
        chunk_params = params[start * PARAMS_PER_TERM : (start + len(chunk)) * PARAMS_PER_TERM]
        sql = " UNION ALL ".join(chunk)
        with connection.cursor() as cursor:
            try:
                cursor.execute(sql, chunk_params)
            except OperationalError:
                if not hint:
                    raise
                # The index is gone (a later migration rebuilt the table): same answer, slower.
                cursor.execute(sql.replace(hint, ""), chunk_params)
            for term, delay in cursor.fetchall():
                found.setdefault(int(term), []).append(float(delay))
    out: dict[str, dict[float, float]] = {}
    for term, (name, fraction, weight) in enumerate(wanted):
        if term in found:  # else deleted meanwhile
            out.setdefault(name, {})[fraction] = _interpolate(found[term], weight)
    return out


def sqlite_bucket_counts(
    alias: str, starts: Sequence[datetime], width: Any, tasks: Sequence[str]
) -> tuple[list[tuple[int, int]], dict[str, list[tuple[int, int]]]]:
    """Runs and triggers (lost and retried runs excluded) per bucket: in all, and per task of
    ``tasks``.

    One correlated count per bucket (and per task and bucket), each a range of a covering
    index: no sort of the runs, which SQLite's ``GROUP BY`` would need. Two statements.
    Returns ``([(runs, triggers) per bucket], {task: [(runs, triggers) per bucket]})``.
    """
    connection = connections[alias]
    qn = connection.ops.quote_name
    table = qn(DebounceRun._meta.db_table)
    adapt = partial(adapt_time, connection.ops)
    ranges = [(adapt(start), adapt(start + width)) for start in starts]
    in_range = (
        f"{qn('started_at')} >= b.lo AND {qn('started_at')} < b.hi "
        f"AND {qn('outcome')} NOT IN (%s, %s)"
    )

    def run(sql: str, rows: list[list[Any]], columns: str) -> list[tuple[Any, ...]]:
        if not rows:
            return []
        values = ", ".join(["(" + ", ".join(["%s"] * len(rows[0])) + ")"] * len(rows))
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH b({columns}) AS (VALUES {values}) {sql}",
                [v for row in rows for v in row] + [*REDONE, *REDONE],
            )
            return list(cursor.fetchall())

    total = run(
        f"SELECT b.i, (SELECT COUNT(*) FROM {table} INDEXED BY {qn('debounce_run_summary')} "
        f"WHERE {in_range}), (SELECT TOTAL({qn('triggers')}) FROM {table} INDEXED BY "
        f"{qn('debounce_run_summary')} WHERE {in_range}) FROM b",
        [[i, lo, hi] for i, (lo, hi) in enumerate(ranges)],
        "i, lo, hi",
    )
    task_filter = f"{qn('task_name')} = b.task AND {in_range}"
    per_task = run(
        f"SELECT b.task, b.i, (SELECT COUNT(*) FROM {table} INDEXED BY "
        f"{qn('debounce_run_task_summary')} WHERE {task_filter}), (SELECT TOTAL({qn('triggers')}) "
        f"FROM {table} INDEXED BY {qn('debounce_run_task_summary')} WHERE {task_filter}) FROM b",
        [[name, i, lo, hi] for name in tasks for i, (lo, hi) in enumerate(ranges)],
        "task, i, lo, hi",
    )
    totals = [(0, 0)] * len(ranges)
    for i, n_runs, n_triggers in total:
        totals[int(i)] = (int(n_runs), int(n_triggers))
    by_task: dict[str, list[tuple[int, int]]] = {name: [(0, 0)] * len(ranges) for name in tasks}
    for name, i, n_runs, n_triggers in per_task:
        by_task[name][int(i)] = (int(n_runs), int(n_triggers))
    return totals, by_task
