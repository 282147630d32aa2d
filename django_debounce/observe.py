"""What the flow reports at a trigger counted, a run started and a run finished: Django
signals, log lines and Prometheus metrics (docs/guide/integration.md, "Signals", "Logging",
"Prometheus")."""

from __future__ import annotations

import logging
import time
from typing import Any

from django_debounce import registry, signals
from django_debounce.state import Claim, TriggerResult

logger = logging.getLogger("django_debounce")

SUCCESS = "success"
FAILURE = "failure"  # after the last retry
RETRY = "retry"  # failed; the claimed triggers went back to pending for a retry

DELAY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class Metrics:
    """The Prometheus metrics of django-debounce, registered once in prometheus-client's
    default registry."""

    def __init__(self, prometheus: Any) -> None:
        counter, histogram = prometheus.Counter, prometheus.Histogram
        self.triggers = counter("django_debounce_triggers", "Triggers counted.", ["task"])
        self.runs = counter("django_debounce_runs", "Runs started.", ["task"])
        self.merged = counter(
            "django_debounce_merged_triggers",
            "Triggers absorbed by a run without a run of their own.",
            ["task"],
        )
        self.failures = counter("django_debounce_run_failures", "Runs whose body raised.", ["task"])
        self.delay = histogram(
            "django_debounce_trigger_to_start_delay_seconds",
            "Seconds from the last claimed trigger to the start of its run.",
            ["task"],
            buckets=DELAY_BUCKETS,
        )
        self._trigger_children: dict[str, Any] = {}
        self.published = counter(
            "django_debounce_pump_published",
            "Dispatch messages the pumps of this process published.",
        )
        self.taken_again = counter(
            "django_debounce_pump_taken_again",
            "Dispatch messages published again because the first was not claimed within "
            "DEBOUNCE_DISPATCH_GRACE (the same sequence number: a duplicate, never a second run).",
        )
        self.tick = histogram(
            "django_debounce_pump_tick_seconds",
            "Seconds one pump tick took (peek, take, publish).",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
        )
        try:
            prometheus.REGISTRY.register(IndexCollector())
        except ValueError:  # registered already (a second Metrics in one process)
            pass

    def count_trigger(self, task_name: str) -> None:
        """``triggers`` of ``task_name`` plus one; the labelled child is looked up once per
        task (prometheus-client's ``labels()`` costs more than the increment)."""
        child = self._trigger_children.get(task_name)
        if child is None:
            child = self._trigger_children[task_name] = self.triggers.labels(task_name)
        child.inc()


class IndexCollector:
    """Prometheus collector of the due index, read from the stores when metrics are scraped
    (never on a timer: an idle worker does not pay for it): per task, the index depth
    (``django_debounce_index_depth``), the entries due now (``django_debounce_index_due``) and
    how late the oldest due entry is (``django_debounce_index_oldest_due_seconds``)."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        depth = GaugeMetricFamily(
            "django_debounce_index_depth", "Entries in the due index.", labels=["task"]
        )
        due = GaugeMetricFamily(
            "django_debounce_index_due", "Due index entries due now.", labels=["task"]
        )
        oldest = GaugeMetricFamily(
            "django_debounce_index_oldest_due_seconds",
            "Seconds the oldest due entry of the due index is overdue.",
            labels=["task"],
        )
        try:
            for name, stats in index_stats().items():
                depth.add_metric([name], stats.depth)
                due.add_metric([name], stats.due)
                oldest.add_metric([name], stats.oldest_due_age)
        except Exception:
            logger.warning("django_debounce: could not read the due index", exc_info=True)
        yield depth
        yield due
        yield oldest


def index_stats() -> dict[str, Any]:
    """``IndexStats`` per registered debounced task, from every store they use."""
    out: dict[str, Any] = {}
    for backend, tasks in registry.by_store().items():
        out.update(backend.index_stats(list(tasks)))
    return out


def pumped(published: int, again: int, seconds: float) -> None:
    """A pump tick published ``published`` messages (``again`` of them taken again)."""
    if metrics is not None:
        if published:
            metrics.published.inc(published)
        if again:
            metrics.taken_again.inc(again)
        metrics.tick.observe(seconds)


try:
    import prometheus_client
except ImportError:
    metrics: Metrics | None = None
else:
    metrics = Metrics(prometheus_client)


def _send(signal: Any, name: str, sender: Any, **kwargs: Any) -> None:
    """``send_robust``: a receiver that raises is logged and never stops the flow (Django
    logs its traceback under ``django.dispatch``)."""
    if not signal.receivers:
        return
    for receiver, response in signal.send_robust(sender, **kwargs):
        if isinstance(response, Exception):
            logger.error(
                "django_debounce: a receiver of %s (%s) raised %s: %s",
                name,
                getattr(receiver, "__qualname__", repr(receiver)),
                type(response).__name__,
                response,
            )


def triggered(task: Any, result: TriggerResult) -> None:
    """A trigger of ``task`` was counted (not for a trigger still deferred to ``on_commit``)."""
    name = task.name
    logger.debug(
        "django_debounce: trigger %s key=%r flight=%s pending=%s %s%s",
        name,
        result.key,
        result.flight_id,
        result.pending,
        "opened" if result.pending == 1 else "merged",
        ", published" if result.scheduled else "",
    )
    if metrics is not None:
        metrics.count_trigger(name)
    _send(
        signals.trigger_received,
        "trigger_received",
        task,
        task_name=name,
        key=result.key,
        flight_id=result.flight_id,
        pending=result.pending,
        due_at=result.due_at,
        scheduled=result.scheduled,
    )


def _run_facts(task: Any, claim: Claim) -> dict[str, Any]:
    delay = (
        max((claim.started_at - claim.last_trigger_at).total_seconds(), 0.0)
        if claim.started_at and claim.last_trigger_at
        else 0.0
    )
    return {
        "task_name": task.name,
        "key": claim.key,
        "flight_id": claim.flight_id,
        "run_id": claim.run_id,
        "triggers": claim.triggers,
        "merged": max(claim.triggers - 1, 0),
        "delay": delay,
        "started_at": claim.started_at,
        "attempt": claim.attempt,
    }


def run_started(task: Any, claim: Claim) -> float:
    """A flight of ``task`` was claimed and its body is about to run.

    Returns a start mark (``time.monotonic()``) to hand to ``run_finished``.
    """
    facts = _run_facts(task, claim)
    logger.info(
        "django_debounce: run %s of %s key=%r started: %d trigger(s), %d merged, %.3f s after "
        "the last trigger",
        claim.run_id,
        facts["task_name"],
        claim.key,
        claim.triggers,
        facts["merged"],
        facts["delay"],
    )
    if metrics is not None:
        label = facts["task_name"]
        metrics.runs.labels(label).inc()
        metrics.merged.labels(label).inc(facts["merged"])
        metrics.delay.labels(label).observe(facts["delay"])
    _send(signals.run_started, "run_started", task, **facts)
    return time.monotonic()


def run_finished(task: Any, claim: Claim, started: float, outcome: str, error: str = "") -> None:
    """The body of a claimed run ended with ``outcome`` (``SUCCESS``, ``RETRY``: failed and
    retried later, ``FAILURE``: failed after the last retry) and the run was recorded.
    ``started`` is the mark ``run_started`` returned; ``error`` the text of the exception."""
    facts = _run_facts(task, claim)
    duration = max(time.monotonic() - started, 0.0)
    level = logging.ERROR if outcome == FAILURE else logging.INFO
    logger.log(
        level,
        "django_debounce: run %s of %s key=%r %s after %.3f s%s",
        claim.run_id,
        facts["task_name"],
        claim.key,
        outcome,
        duration,
        f": {error}" if error else "",
    )
    if metrics is not None and outcome != SUCCESS:
        metrics.failures.labels(facts["task_name"]).inc()
    _send(
        signals.run_finished,
        "run_finished",
        task,
        outcome=outcome,
        error=error,
        duration=duration,
        **facts,
    )
