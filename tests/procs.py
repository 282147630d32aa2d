"""Trigger from several OS processes at once (spawned, each with its own Django and
connections), released together by a barrier."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any


def _child(
    task_name: str, calls: list[list[Any]], pause: float, barrier: Any, out: Any, backend: str
) -> None:
    os.environ["DEBOUNCE_TEST_WORKER"] = "1"  # use the test database, like the worker does
    os.environ["DEBOUNCE_TEST_BACKEND"] = backend
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import tests.celery_app  # noqa: F401
    from tests.testapp import tasks

    task = getattr(tasks, task_name)
    errors: list[str] = []
    barrier.wait(timeout=60)
    for args in calls:
        try:
            task.trigger(*args)
        except Exception as exc:  # reported to the test, which fails on any
            errors.append(f"{type(exc).__name__}: {exc}")
        if pause:
            time.sleep(pause)
    out.put((os.getpid(), errors))


def trigger_from_processes(
    task_name: str, per_process: list[list[list[Any]]], *, pause: float = 0.0, timeout: float = 120
) -> list[str]:
    """Run ``task.trigger(*args)`` for each ``args`` of ``per_process[i]`` in process ``i``,
    all processes starting together. Returns every error raised in any process."""
    from django.conf import settings

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(per_process))
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_child, args=(task_name, calls, pause, barrier, out, settings.DEBOUNCE_BACKEND)
        )
        for calls in per_process
    ]
    for p in procs:
        p.start()
    errors: list[str] = []
    for _ in procs:
        _pid, errs = out.get(timeout=timeout)
        errors.extend(errs)
    for p in procs:
        p.join(timeout=timeout)
        assert p.exitcode == 0, f"trigger process exited with {p.exitcode}"
    return errors
