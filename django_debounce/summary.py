"""The per-task summary of the admin: triggers in, runs out, coalescing ratio and the
trigger-to-start delay (median, 95th percentile) over a period, with counts per time bucket,
aggregated in the database in a fixed number of statements (docs/design.md, "The summary's
SQL")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.paginator import Paginator
from django.db import OperationalError, connections, router
from django.db.models import Aggregate, Case, Count, F, FloatField, Func, IntegerField, Q, Sum, When

from django_debounce import dbtime
from django_debounce.models import DebounceKey, DebounceRun

__all__ = ["PERIODS", "Summary", "TaskSummary", "percentile_positions", "summarize"]

# name -> (length of the period, width of one chart bucket)
PERIODS: dict[str, tuple[timedelta, timedelta]] = {
    "1h": (timedelta(hours=1), timedelta(minutes=5)),
    "24h": (timedelta(days=1), timedelta(hours=1)),
    "7d": (timedelta(days=7), timedelta(hours=6)),
    "30d": (timedelta(days=30), timedelta(days=1)),
}
DEFAULT_PERIOD = "24h"
# The delay percentiles of a TaskSummary: attribute -> fraction.
DELAYS = {"median_delay": 0.5, "p95_delay": 0.95}
PER_PAGE = 50
# The counts of a TaskSummary (query 1 gives them as n_<name>, but active_keys).
COUNTS = ("runs", "triggers", "failures", "retried", "lost", "active_keys")
# Runs whose triggers a later run covers again: counted apart, never as runs out.
REDONE = (DebounceRun.Outcome.LOST, DebounceRun.Outcome.RETRY)
# Created on SQLite only, by migration 0001; read by ``offset_percentiles``.
SQLITE_DELAY_INDEX = "debounce_run_task_delay"
# SQLite allows at most 500 terms in one compound SELECT.
SQLITE_MAX_TERMS = 500
PARAMS_PER_TERM = 8


@dataclass
class TaskSummary:
    """One task's figures over the period. Delays are seconds (``None`` without runs)."""

    task_name: str
    runs: int = 0
    triggers: int = 0
    failures: int = 0
    retried: int = 0
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


def summarize(
    period: str = DEFAULT_PERIOD,
    *,
    page: int | str | None = 1,
    per_page: int = PER_PAGE,
    now: datetime | None = None,
) -> Summary:
    """Aggregate the runs that started in the last ``period`` (a key of ``PERIODS``), per task,
    in the database the router reads runs from (PostgreSQL or SQLite).

    ``page`` (1-based) selects ``per_page`` tasks, most triggers first, as Django's
    ``Paginator.get_page`` does (the last page past the end, the first for a value that is no
    number). ``now`` (aware) ends the period (default: now).
    Returns a ``Summary``. Raises ``ValueError`` for an unknown period.
    """
    if period not in PERIODS:
        raise ValueError(f"period must be one of {', '.join(PERIODS)}, not {period!r}")
    alias = router.db_for_read(DebounceRun)
    postgresql = connections[alias].vendor == "postgresql"
    length, width = PERIODS[period]
    until = now or dbtime.now()
    since = until - length
    runs = DebounceRun.objects.using(alias).filter(started_at__gte=since, started_at__lt=until)
    counted = ~Q(outcome__in=REDONE)
    aggregates: dict[str, Any] = {
        # Count a column of the covering index (not the primary key), so that PostgreSQL
        # answers from the index alone.
        "n_runs": Count("started_at", filter=counted),
        "n_triggers": Sum("triggers", filter=counted),
        "n_failures": Count("started_at", filter=Q(outcome=DebounceRun.Outcome.FAILURE)),
        "n_retried": Count("started_at", filter=Q(outcome=DebounceRun.Outcome.RETRY)),
        "n_lost": Count("started_at", filter=Q(outcome=DebounceRun.Outcome.LOST)),
    }
    if postgresql:
        # percentile_cont skips NULLs: a CASE, not a FILTER clause (whose SQL Django builds
        # differently from one version to the next), leaves the redone runs out.
        delay = Case(When(counted, then=F("delay")), output_field=FloatField())
        for name, fraction in DELAYS.items():
            aggregates[name] = PercentileCont(delay, fraction)
    summaries = _per_task(runs, alias, aggregates)
    summaries.sort(key=lambda s: (-s.triggers, -s.active_keys, s.task_name))
    paginated = Paginator(summaries, per_page).get_page(page)
    shown = list(paginated)
    if not postgresql:  # query 2
        offset_percentiles(shown, alias, since, until)
    starts = [since + width * i for i in range(int(length / width))]
    totals = TaskSummary("", **{n: sum(getattr(s, n) for s in summaries) for n in COUNTS})
    _fill_buckets(totals, shown, runs.filter(counted), since, width, len(starts))  # query 3
    return Summary(
        period=period,
        since=since,
        until=until,
        bucket_width=width,
        bucket_starts=starts,
        tasks=shown,
        totals=totals,
        page=paginated.number,
        pages=paginated.paginator.num_pages,
        task_count=len(summaries),
    )


def _per_task(runs: Any, alias: str, aggregates: dict[str, Any]) -> list[TaskSummary]:
    """One ``TaskSummary`` per task with runs in the period or keys pending or running now
    (queries 1 and 4), unsorted."""
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
        counts: dict[str, Any] = {n: row.get(f"n_{n}") or 0 for n in COUNTS}
        counts["active_keys"] = active.get(name, 0)
        summaries.append(TaskSummary(name, **counts, **{delay: row.get(delay) for delay in DELAYS}))
    return summaries


def _fill_buckets(
    totals: TaskSummary,
    shown: list[TaskSummary],
    counted_runs: Any,
    since: datetime,
    width: timedelta,
    n_buckets: int,
) -> None:
    """Triggers and runs per time bucket, of all tasks (``totals``) and of each ``shown``
    task (query 3)."""
    by_name = {s.task_name: s for s in shown}
    for s in (totals, *shown):
        s.bucket_triggers, s.bucket_runs = [0] * n_buckets, [0] * n_buckets
    buckets = (
        counted_runs.order_by()
        .annotate(b=Bucket("started_at", since, width))
        .values("task_name", "b")
        .annotate(n_runs=Count("started_at"), n_triggers=Sum("triggers"))
        .values_list("task_name", "b", "n_runs", "n_triggers")
    )
    for name, b, n_runs, n_triggers in buckets:
        if not 0 <= b < n_buckets:
            continue
        for counted in (totals, by_name.get(name)):
            if counted is not None:
                counted.bucket_runs[b] += n_runs
                counted.bucket_triggers[b] += n_triggers or 0


class PercentileCont(Aggregate):
    """PostgreSQL's ordered-set aggregate ``percentile_cont(fraction) WITHIN GROUP (ORDER BY x)``
    (continuous percentile, linear interpolation between the two nearest values)."""

    function = "PERCENTILE_CONT"
    name = "PercentileCont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, fraction: float) -> None:
        # No filter=: the template has no place for it (use a CASE; NULLs are skipped).
        super().__init__(expression, fraction=repr(float(fraction)))


class Bucket(Func):
    """Index of the ``width``-wide time bucket that a datetime column falls in, counted from
    ``origin`` (aware): ``floor((time - origin) / width)``, on PostgreSQL and SQLite."""

    output_field = IntegerField()

    def __init__(self, expression: Any, origin: datetime, width: timedelta) -> None:
        super().__init__(expression)
        self.origin, self.width = origin, width.total_seconds()

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.source_expressions[0])
        # date_part is double precision; EXTRACT is numeric since PostgreSQL 14, and slower.
        epoch = f"FLOOR((date_part('epoch', {sql}) - %s) / %s)::bigint"
        return epoch, [*params, self.origin.timestamp(), self.width]

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.source_expressions[0])
        # Without USE_TZ a stored time is naive in TIME_ZONE, which Django makes the process's
        # zone (TZ): SQLite's 'utc' converts it, so a day across a DST change is 23 or 25 hours.
        at = f"julianday({sql})" if settings.USE_TZ else f"julianday({sql}, 'utc')"
        days = f"CAST(({at} - julianday(%s)) * 86400 / %s AS INTEGER)"  # never negative here
        origin = self.origin.astimezone(UTC).replace(tzinfo=None).isoformat(" ")
        return days, [*params, origin, self.width]


def percentile_positions(n: int, fraction: float) -> tuple[int, int, float]:
    """1-based row numbers of the two values around the ``fraction`` percentile of ``n``
    sorted values, and the interpolation weight of the upper one (as ``percentile_cont``)."""
    index = (n - 1) * fraction
    low = math.floor(index)
    return low + 1, min(low + 2, n), index - low


def offset_percentiles(
    shown: list[TaskSummary], alias: str, since: datetime, until: datetime
) -> None:
    """Set the ``DELAYS`` of the ``shown`` tasks (their ``runs`` counted) from the runs that
    started from ``since`` to ``until``, on SQLite (query 2): each percentile is read with
    ``ORDER BY delay LIMIT 2 OFFSET k`` from the nearer end through the index
    ``SQLITE_DELAY_INDEX`` (nothing is sorted), all of them in one statement."""
    connection = connections[alias]
    qn = connection.ops.quote_name
    table = qn(DebounceRun._meta.db_table)
    hint = f" INDEXED BY {qn(SQLITE_DELAY_INDEX)}"
    bounds = [connection.ops.adapt_datetimefield_value(dbtime.to_db(t)) for t in (since, until)]
    terms: list[str] = []
    params: list[Any] = []
    wanted: list[tuple[TaskSummary, str, float]] = []
    for task in shown:
        n = task.runs
        if not n:
            continue
        for attribute, fraction in DELAYS.items():
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
            params += [len(wanted), task.task_name, *bounds, *REDONE, high - low + 1, offset]
            wanted.append((task, attribute, weight))
    found: dict[int, list[float]] = {}
    for start in range(0, len(terms), SQLITE_MAX_TERMS):
        chunk = terms[start : start + SQLITE_MAX_TERMS]
        chunk_params = params[start * PARAMS_PER_TERM : (start + len(chunk)) * PARAMS_PER_TERM]
        sql = " UNION ALL ".join(chunk)
        with connection.cursor() as cursor:
            try:
                cursor.execute(sql, chunk_params)
            except OperationalError:
                # The index is gone (a later migration rebuilt the table): same answer, slower.
                cursor.execute(sql.replace(hint, ""), chunk_params)
            for term, delay in cursor.fetchall():
                found.setdefault(int(term), []).append(float(delay))
    for term, (task, attribute, weight) in enumerate(wanted):
        if term in found:  # else deleted meanwhile
            lower, upper = min(found[term]), max(found[term])
            setattr(task, attribute, lower + (upper - lower) * weight)
