"""The tasks of the scale benchmark's idle phase by task count (``bench/scale.py``): a worker
started with ``BENCH_IDLE_TASKS=N`` (``bench/scale_settings.py``) registers ``N`` debounced
tasks on the Redis store, ``scale.idle_0`` to ``scale.idle_<N-1>``, and no other; the runner
calls ``make(50)`` to make their pending keys.
"""

from __future__ import annotations

import os
from typing import Any

import bench.celery_app  # noqa: F401  (the app every task here publishes through)
from bench.scale_hooks import note
from django_debounce import debounced_task

IDLE_WAIT = 3600  # pending for the whole run: an idle pump only peeks

_made: dict[int, Any] = {}


def _body(i: int) -> Any:
    def body(item: int) -> None:
        note(f"idle_{i}", item)

    body.__name__ = body.__qualname__ = f"idle_{i}"
    return body


def make(n: int) -> list[Any]:
    """The first ``n`` idle tasks, registered once each."""
    for i in range(len(_made), n):
        task = debounced_task(wait=IDLE_WAIT, backend="redis", name=f"scale.idle_{i}")
        _made[i] = task(_body(i))
    return [_made[i] for i in range(n)]


TASKS = make(int(os.environ.get("BENCH_IDLE_TASKS", "0") or 0))
