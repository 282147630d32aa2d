"""Recovery outside a worker's pump, for ``debounce_purge`` (docs/design.md, "Recovery is the
pump"): ``recover()`` runs one pump pass for every registered debounced task."""

from __future__ import annotations

from typing import Any

from django_debounce import live, registry
from django_debounce.backends import get_backend
from django_debounce.pump import Pump, stats
from django_debounce.state import FlightOptions


def recover() -> int:
    """One pump pass: redo runs whose lease ran out, publish flights that are due (their
    message never went out, or went out more than ``DEBOUNCE_DISPATCH_GRACE`` ago and was not
    claimed: the same sequence number goes out again). Only tasks registered here as
    debounced tasks are published. Returns how many messages were published."""
    before = stats.published
    Pump().tick()
    return stats.published - before


def cancel_unregistered(keys: Any, *, dry_run: bool = False) -> tuple[int, int, list[str]]:
    """Drop the pending triggers of the keys in ``keys`` (a ``DebounceKey`` queryset) whose
    task is not a registered debounced task here (removed or renamed); nothing is
    dispatched. Such keys then turn idle and are purged like any other. Returns ``(keys with
    triggers dropped, triggers dropped, task names)``; with ``dry_run`` counts what would be
    dropped, with the triggers Redis counters hold and no step folded yet."""
    registered = registry.names()
    orphans = keys.active().exclude(task_name__in=registered)
    names = sorted(set(orphans.values_list("task_name", flat=True)))
    if dry_run:
        rows = list(orphans.only("key_hash", "pending"))
        live.refresh(rows)
        counts = [row.live_pending for row in rows]  # type: ignore[attr-defined]
        return sum(1 for p in counts if p), sum(counts), names
    touched = dropped = 0
    backend = get_backend()
    for row in orphans.only("key_hash", "task_name").iterator():
        n = backend.cancel(row.key_hash, task_name=row.task_name, options=FlightOptions(wait=0.0))
        touched += 1 if n else 0
        dropped += n
    return touched, dropped, names
