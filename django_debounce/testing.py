"""Helpers for your own tests: run every due flight in-process, no worker needed.

Under Celery's ``task_always_eager`` a trigger never runs the body at trigger time: it stays
pending until ``run_due()`` or a flush, so tests cannot pass by accident.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django_debounce import registry
from django_debounce.backends import get_backend
from django_debounce.state import FireAction


def run_due(now: datetime | None = None, *, backend: str | None = None) -> int:
    """Claim and run every flight due at ``now`` (default: the store's clock) in this process,
    again and again until none is due (a collected flight larger than ``collect_limit`` runs
    as several batches). Runs whose lease ran out by ``now`` are recovered first.

    ``now`` is an aware datetime; pass a future time to run flights whose ``wait`` has not
    passed yet. Returns how many runs executed. A body's exception propagates at once (after
    its failure or retry is recorded); flights not yet run stay due for the next call.
    """
    store = get_backend(backend)
    tasks = registry.options()
    # Runs whose lease ran out by `now` go back to pending first (the messages the take
    # returns are not published: this function is the worker).
    store.take(tasks, 1_000_000, now=now)
    count = 0
    for _pass in range(1000):
        ran = 0
        for task_name, key_hash in store.due_keys(now, list(tasks)):
            task = registry.get(task_name)
            decision = task.get_backend().fire(
                key_hash, None, task_name=task.name, options=task.flight_options(), now=now
            )
            if decision.action is FireAction.CLAIM and decision.claim is not None:
                task.run_claim(task.get_backend(), decision.claim)
                ran += 1
        count += ran
        if not ran:
            break
    return count


try:
    import pytest

    @pytest.fixture
    def debounce_run_due() -> Iterator[Any]:
        """Pytest fixture: a callable that runs every due flight now (``run_due``)."""
        yield run_due
except ImportError:  # pragma: no cover - pytest is optional at runtime
    pass
