"""The per-task summary of the admin: triggers in, runs out, coalescing ratio and the
trigger-to-start delay (median, 95th percentile) over a period, with counts per time bucket.

Everything is aggregated in the database, in a fixed number of queries whatever the size of
the tables (DESIGN.md section 6):

1. one ``GROUP BY task_name`` over the runs that started in the period (a range scan of the
   covering index ``debounce_run_summary``); on PostgreSQL the percentiles are computed in the
   same query with ``percentile_cont``;
2. elsewhere (SQLite, MySQL 8) one window query numbers each task's delays in order and
   returns only the two rows around each percentile, which are interpolated as
   ``percentile_cont`` does (never loading the runs into Python);
3. one ``GROUP BY task_name, bucket`` for the charts (fixed-width buckets of the period);
4. one ``GROUP BY task_name`` over the keys that are pending or running now.

A lost run (its lease ran out) is redone by a later run covering the same triggers, so lost
runs are counted apart and left out of triggers, runs and delays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, router
from django.db.models import Aggregate, Count, F, FloatField, Func, IntegerField, Q, Sum, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from django_debounce.models import DebounceKey, DebounceRun

# name -> (length of the period, width of one chart bucket)
PERIODS: dict[str, tuple[timedelta, timedelta]] = {
    "1h": (timedelta(hours=1), timedelta(minutes=5)),
    "24h": (timedelta(days=1), timedelta(hours=1)),
    "7d": (timedelta(days=7), timedelta(hours=6)),
    "30d": (timedelta(days=30), timedelta(days=1)),
}
DEFAULT_PERIOD = "24h"
FRACTIONS = (0.5, 0.95)
PER_PAGE = 50


class PercentileCont(Aggregate):
    """PostgreSQL's ordered-set aggregate ``percentile_cont(fraction) WITHIN GROUP (ORDER BY x)``
    (continuous percentile, linear interpolation between the two nearest values)."""

    function = "PERCENTILE_CONT"
    name = "PercentileCont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction must be between 0 and 1, got {fraction!r}")
        super().__init__(expression, fraction=repr(float(fraction)), **extra)


class Bucket(Func):
    """Index of the fixed-width time bucket a datetime falls in:
    ``floor((epoch seconds - origin) / width)``, in SQL (PostgreSQL, SQLite, MySQL)."""

    output_field = IntegerField()

    def __init__(self, expression: Any, origin: int, width: int) -> None:
        super().__init__(expression)
        self.origin, self.width = int(origin), int(width)

    def _compile(self, compiler: Any, connection: Any, epoch: str) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.source_expressions[0])
        return epoch.format(sql), [*params, self.origin, self.width]

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        raise NotImplementedError(f"time buckets are not implemented for {connection.vendor}")

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, Any]:
        # date_part is double precision; EXTRACT is numeric since PostgreSQL 14, and slower.
        return self._compile(
            compiler, connection, "FLOOR((date_part('epoch', {}) - %s) / %s)::bigint"
        )

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, Any]:
        # Integer division of non-negative integers is floor division in SQLite.
        return self._compile(
            compiler, connection, "((CAST(strftime('%%s', {}) AS INTEGER) - %s) / %s)"
        )

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, Any]:
        return self._compile(compiler, connection, "FLOOR((UNIX_TIMESTAMP({}) - %s) / %s)")


@dataclass
class TaskSummary:
    """One task's figures over the period. Delays are seconds (``None`` without runs)."""

    task_name: str
    runs: int = 0
    triggers: int = 0
    failures: int = 0
    lost: int = 0
    active_keys: int = 0
    median_delay: float | None = None
    p95_delay: float | None = None
    bucket_triggers: list[int] = field(default_factory=list)
    bucket_runs: list[int] = field(default_factory=list)

    @property
    def merged(self) -> int:
        """Triggers absorbed without a run of their own."""
        return max(self.triggers - self.runs, 0)

    @property
    def ratio(self) -> float | None:
        """The coalescing ratio: triggers per run (``None`` without runs)."""
        return self.triggers / self.runs if self.runs else None


@dataclass
class Summary:
    """The summary page's data: ``tasks`` is the current page of tasks (most triggers first);
    ``totals`` covers every task; ``bucket_starts`` are the chart buckets' start times."""

    period: str
    since: datetime
    until: datetime
    bucket_width: timedelta
    bucket_starts: list[datetime]
    tasks: list[TaskSummary]
    totals: TaskSummary
    page: int
    pages: int
    task_count: int
    percentile_method: str


def percentile_positions(n: int, fraction: float) -> tuple[int, int, float]:
    """1-based row numbers of the two values around the ``fraction`` percentile of ``n``
    sorted values, and the interpolation weight of the upper one (as ``percentile_cont``)."""
    index = (n - 1) * fraction
    low = math.floor(index)
    return low + 1, min(low + 2, n), index - low


def _window_percentiles(
    runs: Any, alias: str, counts: dict[str, int]
) -> dict[str, dict[float, float]]:
    """Percentiles of ``delay`` per task with a window function, reading only the rows
    around each percentile. ``counts`` is the number of runs of each wanted task in ``runs``."""
    wanted = {name: n for name, n in counts.items() if n}
    if not wanted:
        return {}
    inner = (
        runs.filter(task_name__in=list(wanted))
        .annotate(
            rn=Window(RowNumber(), partition_by=[F("task_name")], order_by=[F("delay").asc()])
        )
        .values("task_name", "delay", "rn")
    )
    sql, params = inner.query.get_compiler(using=alias).as_sql()
    connection = connections[alias]
    qn = connection.ops.quote_name
    where, where_params = [], []
    positions: dict[str, list[tuple[float, int, int, float]]] = {}
    for name, n in wanted.items():
        rows: set[int] = set()
        for fraction in FRACTIONS:
            low, high, weight = percentile_positions(n, fraction)
            positions.setdefault(name, []).append((fraction, low, high, weight))
            rows.update((low, high))
        where.append(
            f"({qn('task_name')} = %s AND {qn('rn')} IN ({', '.join(['%s'] * len(rows))}))"
        )
        where_params += [name, *sorted(rows)]
    query = (
        f"SELECT {qn('task_name')}, {qn('rn')}, {qn('delay')} FROM ({sql}) w "
        f"WHERE {' OR '.join(where)}"
    )
    values: dict[tuple[str, int], float] = {}
    with connection.cursor() as cursor:
        cursor.execute(query, [*params, *where_params])
        for name, rn, delay in cursor.fetchall():
            values[(name, int(rn))] = float(delay)
    out: dict[str, dict[float, float]] = {}
    for name, wanted_rows in positions.items():
        for fraction, low, high, weight in wanted_rows:
            lo, hi = values.get((name, low)), values.get((name, high))
            if lo is None or hi is None:  # rows deleted between the two queries
                continue
            out.setdefault(name, {})[fraction] = lo + (hi - lo) * weight
    return out


def summarize(
    period: str = DEFAULT_PERIOD,
    *,
    page: int = 1,
    per_page: int = PER_PAGE,
    now: datetime | None = None,
    using: str | None = None,
    percentiles: str = "auto",
) -> Summary:
    """Aggregate the runs that started in the last ``period`` (a key of ``PERIODS``), per task.

    ``page`` (1-based) selects ``per_page`` tasks, most triggers first. ``percentiles`` is
    ``"auto"`` (``percentile_cont`` on PostgreSQL, the window query elsewhere), ``"sql"`` or
    ``"window"``. Raises ``ValueError`` for an unknown period or method.
    """
    if period not in PERIODS:
        raise ValueError(f"period must be one of {', '.join(PERIODS)}, not {period!r}")
    if percentiles not in ("auto", "sql", "window"):
        raise ValueError(f"percentiles must be 'auto', 'sql' or 'window', not {percentiles!r}")
    alias = using or router.db_for_read(DebounceRun)
    vendor = connections[alias].vendor
    method = percentiles if percentiles != "auto" else "sql" if vendor == "postgresql" else "window"
    length, width = PERIODS[period]
    until = now or timezone.now()
    since = until - length
    runs = DebounceRun.objects.using(alias).filter(started_at__gte=since, started_at__lt=until)
    counted = ~Q(outcome=DebounceRun.Outcome.LOST)
    aggregates: dict[str, Any] = {
        # Count a column of the covering index (not the primary key), so that PostgreSQL
        # answers from the index alone.
        "n_runs": Count("started_at", filter=counted),
        "n_triggers": Sum("triggers", filter=counted),
        "n_failures": Count("started_at", filter=Q(outcome=DebounceRun.Outcome.FAILURE)),
        "n_lost": Count("started_at", filter=Q(outcome=DebounceRun.Outcome.LOST)),
    }
    if method == "sql":
        for fraction in FRACTIONS:
            aggregates[f"p{int(fraction * 100)}"] = PercentileCont(
                "delay", fraction, filter=counted
            )
    per_task = {
        row["task_name"]: row
        for row in runs.order_by().values("task_name").annotate(**aggregates)  # query 1
    }
    active = dict(  # query 4
        DebounceKey.objects.using(alias)
        .filter(state__in=[DebounceKey.State.PENDING, DebounceKey.State.RUNNING])
        .order_by()
        .values("task_name")
        .annotate(n=Count("id"))
        .values_list("task_name", "n")
    )
    summaries = []
    for name in set(per_task) | set(active):
        row = per_task.get(name, {})
        summaries.append(
            TaskSummary(
                task_name=name,
                runs=row.get("n_runs") or 0,
                triggers=row.get("n_triggers") or 0,
                failures=row.get("n_failures") or 0,
                lost=row.get("n_lost") or 0,
                active_keys=active.get(name, 0),
                median_delay=row.get("p50"),
                p95_delay=row.get("p95"),
            )
        )
    summaries.sort(key=lambda s: (-s.triggers, -s.active_keys, s.task_name))
    pages = max(math.ceil(len(summaries) / per_page), 1)
    page = min(max(page, 1), pages)
    shown = summaries[(page - 1) * per_page : page * per_page]
    if method == "window":  # query 2
        found = _window_percentiles(
            runs.exclude(outcome=DebounceRun.Outcome.LOST),
            alias,
            {s.task_name: s.runs for s in shown},
        )
        for s in shown:
            s.median_delay = found.get(s.task_name, {}).get(0.5)
            s.p95_delay = found.get(s.task_name, {}).get(0.95)

    n_buckets = int(length / width)
    starts = [since + width * i for i in range(n_buckets)]
    totals = TaskSummary(
        task_name="",
        runs=sum(s.runs for s in summaries),
        triggers=sum(s.triggers for s in summaries),
        failures=sum(s.failures for s in summaries),
        lost=sum(s.lost for s in summaries),
        active_keys=sum(s.active_keys for s in summaries),
        bucket_triggers=[0] * n_buckets,
        bucket_runs=[0] * n_buckets,
    )
    by_name = {s.task_name: s for s in shown}
    for s in shown:
        s.bucket_triggers, s.bucket_runs = [0] * n_buckets, [0] * n_buckets
    try:
        buckets = list(  # query 3
            runs.filter(counted)
            .order_by()
            .annotate(b=Bucket("started_at", int(since.timestamp()), int(width.total_seconds())))
            .values("task_name", "b")
            .annotate(n_runs=Count("started_at"), n_triggers=Sum("triggers"))
            .values_list("task_name", "b", "n_runs", "n_triggers")
        )
    except NotImplementedError:  # another database: no charts
        buckets = []
    for name, b, n_runs, n_triggers in buckets:
        b = int(b)
        if not 0 <= b < n_buckets:
            continue
        totals.bucket_runs[b] += n_runs
        totals.bucket_triggers[b] += n_triggers or 0
        if name in by_name:
            by_name[name].bucket_runs[b] += n_runs
            by_name[name].bucket_triggers[b] += n_triggers or 0
    return Summary(
        period=period,
        since=since,
        until=until,
        bucket_width=width,
        bucket_starts=starts,
        tasks=shown,
        totals=totals,
        page=page,
        pages=pages,
        task_count=len(summaries),
        percentile_method=method,
    )
