"""Trigger, or take as pumps do, from several OS processes at once (spawned, each with its
own Django and connections), released together by a barrier."""

from __future__ import annotations

import multiprocessing
import os
import time
from datetime import UTC
from typing import Any


def _child(
    task_name: str,
    calls: list[list[Any]],
    pause: float,
    barrier: Any,
    out: Any,
    backend: str,
    many: bool = False,
) -> None:
    os.environ["DEBOUNCE_TEST_WORKER"] = "1"  # use the test database, like the worker does
    os.environ["DEBOUNCE_TEST_BACKEND"] = backend
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import tests.celery_app  # noqa: F401
    from django_debounce import trigger_many
    from tests.testapp import tasks

    task = getattr(tasks, task_name)
    errors: list[str] = []
    barrier.wait(timeout=60)
    for args in calls:
        try:
            if many:
                trigger_many(task, [tuple(item) for item in args])
            else:
                task.trigger(*args)
        except Exception as exc:  # reported to the test, which fails on any
            errors.append(f"{type(exc).__name__}: {exc}")
        if pause:
            time.sleep(pause)
    out.put((os.getpid(), errors))


def trigger_from_processes(
    task_name: str,
    per_process: list[list[list[Any]]],
    *,
    pause: float = 0.0,
    timeout: float = 120,
    many: bool = False,
) -> list[str]:
    """Run ``task.trigger(*args)`` for each ``args`` of ``per_process[i]`` in process ``i``,
    all processes starting together (``many``: each ``args`` is a list of argument lists, one
    ``trigger_many`` call). Returns every error raised in any process."""
    from django.conf import settings

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(per_process))
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_child,
            args=(task_name, calls, pause, barrier, out, settings.DEBOUNCE_BACKEND, many),
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


def _take_child(
    backend: str, tasks: dict[str, dict[str, Any]], limit: int, now_us: int, barrier: Any, out: Any
) -> None:
    os.environ["DEBOUNCE_TEST_WORKER"] = "1"  # use the test database, like the worker does
    os.environ["DEBOUNCE_TEST_BACKEND"] = backend
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from datetime import datetime, timedelta

    from django_debounce.backends import get_backend
    from django_debounce.state import FlightOptions

    store = get_backend(backend)
    options = {name: FlightOptions(**fields) for name, fields in tasks.items()}
    now = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=now_us)
    taken: list[tuple[str, int]] = []
    errors: list[str] = []
    barrier.wait(timeout=60)
    try:
        while True:
            got = store.take(options, limit, now=now)
            taken.extend((d.key_hash, d.seq) for d in got.dispatches)
            if not got.dispatches:
                break
    except Exception as exc:  # reported to the test, which fails on any
        errors.append(f"{type(exc).__name__}: {exc}")
    out.put((os.getpid(), taken, errors))


def take_from_processes(
    tasks: dict[str, dict[str, Any]],
    *,
    processes: int,
    limit: int,
    now_us: int,
    timeout: float = 120,
) -> list[tuple[list[tuple[str, int]], list[str]]]:
    """Pumps in ``processes`` OS processes, started together, each calling the store's
    ``take(tasks, limit, now=now_us)`` (``tasks``: task name -> ``FlightOptions`` fields)
    until a take gets nothing. Returns, per process, the ``(key_hash, seq)`` it took and the
    errors it met."""
    from django.conf import settings

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_take_child,
            args=(settings.DEBOUNCE_BACKEND, tasks, limit, now_us, barrier, out),
        )
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    results = []
    for _ in procs:
        _pid, taken, errors = out.get(timeout=timeout)
        results.append((taken, errors))
    for p in procs:
        p.join(timeout=timeout)
        assert p.exitcode == 0, f"take process exited with {p.exitcode}"
    return results
