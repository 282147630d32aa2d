"""The per-task summary of the admin: triggers in, runs out, coalescing ratio and the
trigger-to-start delay (median, 95th percentile) over a period, with counts per time bucket,
aggregated in the database in a fixed number of queries (docs/design.md, "Models, admin,
commands and signals"; the SQL is in ``summary_sql.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, router
from django.db.models import Case, Count, F, FloatField, Q, Sum, When

from django_debounce import dbtime
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.summary_sql import (
    Bucket,
    PercentileCont,
    offset_percentiles,
    percentile_positions,
    sqlite_bucket_counts,
)

__all__ = ["PERIODS", "Summary", "TaskSummary", "percentile_positions", "summarize"]

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
METHODS = ("auto", "sql", "offset")
# The counts of a TaskSummary (query 1 gives them as n_<name>, but active_keys).
COUNTS = ("runs", "triggers", "failures", "retried", "lost", "active_keys")
# Runs whose triggers a later run covers again: counted apart, never as runs out.
REDONE = (DebounceRun.Outcome.LOST, DebounceRun.Outcome.RETRY)


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
    page: int = 1,
    per_page: int = PER_PAGE,
    now: datetime | None = None,
    using: str | None = None,
    percentiles: str = "auto",
) -> Summary:
    """Aggregate the runs that started in the last ``period`` (a key of ``PERIODS``), per task.

    ``page`` (1-based) selects ``per_page`` tasks, most triggers first. ``percentiles`` picks
    how percentiles are computed: ``"auto"`` (``"sql"`` on PostgreSQL, ``"offset"`` on SQLite),
    ``"sql"`` (``percentile_cont``, PostgreSQL only) or ``"offset"`` (see ``summary_sql``).
    ``now`` (aware) ends the period (default: now).
    Returns a ``Summary``. Raises ``ValueError`` for an unknown period or method.
    """
    if period not in PERIODS:
        raise ValueError(f"period must be one of {', '.join(PERIODS)}, not {period!r}")
    if percentiles not in METHODS:
        raise ValueError(f"percentiles must be one of {', '.join(METHODS)}, not {percentiles!r}")
    alias = using or router.db_for_read(DebounceRun)
    vendor = connections[alias].vendor
    method = percentiles
    if method == "auto":
        method = "sql" if vendor == "postgresql" else "offset"
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
    if method == "sql":
        # percentile_cont skips NULLs: a CASE, not a FILTER clause (whose SQL Django builds
        # differently from one version to the next), leaves the redone runs out.
        delay = Case(When(counted, then=F("delay")), output_field=FloatField())
        for fraction in FRACTIONS:
            aggregates[f"p{int(fraction * 100)}"] = PercentileCont(delay, fraction)
    summaries = _per_task(runs, alias, aggregates)
    summaries.sort(key=lambda s: (-s.triggers, -s.active_keys, s.task_name))
    pages = max(math.ceil(len(summaries) / per_page), 1)
    page = min(max(page, 1), pages)
    shown = summaries[(page - 1) * per_page : page * per_page]
    if method != "sql":  # query 2
        _fill_percentiles(shown, alias, since, until)
    n_buckets = int(length / width)
    starts = [since + width * i for i in range(n_buckets)]
    totals = TaskSummary("", **{n: sum(getattr(s, n) for s in summaries) for n in COUNTS})
    _fill_buckets(totals, shown, runs.filter(counted), alias, vendor, starts, width)  # query 3
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
        summaries.append(
            TaskSummary(name, **counts, median_delay=row.get("p50"), p95_delay=row.get("p95"))
        )
    return summaries


def _fill_percentiles(
    shown: list[TaskSummary], alias: str, since: datetime, until: datetime
) -> None:
    """Set the median and 95th percentile delay of the ``shown`` tasks by ``offset_percentiles``
    (``"sql"`` computed them in query 1)."""
    counts = {s.task_name: s.runs for s in shown}
    found = offset_percentiles(alias, since, until, counts, FRACTIONS)
    for s in shown:
        s.median_delay = found.get(s.task_name, {}).get(0.5)
        s.p95_delay = found.get(s.task_name, {}).get(0.95)


def _fill_buckets(
    totals: TaskSummary,
    shown: list[TaskSummary],
    counted_runs: Any,
    alias: str,
    vendor: str,
    starts: list[datetime],
    width: Any,
) -> None:
    """Triggers and runs per time bucket, of all tasks (``totals``) and of each ``shown``
    task (query 3; two statements on SQLite)."""
    n_buckets = len(starts)
    totals.bucket_triggers, totals.bucket_runs = [0] * n_buckets, [0] * n_buckets
    by_name = {s.task_name: s for s in shown}
    for s in shown:
        s.bucket_triggers, s.bucket_runs = [0] * n_buckets, [0] * n_buckets
    if vendor == "sqlite":
        all_tasks, per_task_buckets = sqlite_bucket_counts(alias, starts, width, list(by_name))
        for b, (n_runs, n_triggers) in enumerate(all_tasks):
            totals.bucket_runs[b], totals.bucket_triggers[b] = n_runs, n_triggers
        for name, counts_per_bucket in per_task_buckets.items():
            for b, (n_runs, n_triggers) in enumerate(counts_per_bucket):
                by_name[name].bucket_runs[b] = n_runs
                by_name[name].bucket_triggers[b] = n_triggers
        return
    since = starts[0]
    buckets = (
        counted_runs.order_by()
        .annotate(b=Bucket("started_at", int(since.timestamp()), int(width.total_seconds())))
        .values("task_name", "b")
        .annotate(n_runs=Count("started_at"), n_triggers=Sum("triggers"))
        .values_list("task_name", "b", "n_runs", "n_triggers")
    )
    for name, b, n_runs, n_triggers in buckets:
        b = int(b)
        if not 0 <= b < n_buckets:
            continue
        totals.bucket_runs[b] += n_runs
        totals.bucket_triggers[b] += n_triggers or 0
        if name in by_name:
            by_name[name].bucket_runs[b] += n_runs
            by_name[name].bucket_triggers[b] += n_triggers or 0
