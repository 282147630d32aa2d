"""Pumps in OS processes of their own (spawned, each with its own Django, database connection
and Redis client) on the Redis store of a test's own Redis: one that is SIGKILLed in the
middle of a batch (inside ``take``'s transaction, its rows locked and their counters sealed),
and several that take the same due entries at once (tests/stores/test_failover_properties.py).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any


def _setup(redis_url: str) -> Any:
    os.environ["DEBOUNCE_TEST_WORKER"] = "1"  # the test database, as a worker uses
    os.environ["DEBOUNCE_TEST_BACKEND"] = "redis"
    os.environ["DEBOUNCE_TEST_CACHE_URL"] = redis_url  # the store's Redis: the test's own
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django_debounce.backends import get_backend

    return get_backend("redis")


def _options(tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from django_debounce.state import FlightOptions

    return {name: FlightOptions(**fields) for name, fields in tasks.items()}


def _now(now_us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=now_us)


def _held_child(
    redis_url: str, tasks: dict[str, dict[str, Any]], limit: int, now_us: int, out: Any
) -> None:
    """A pump that stops inside its ``take``: after sealing the batch's counters, before
    its transaction commits; it says so on ``out`` and waits to be killed."""
    store = _setup(redis_url)
    sealed = store.settle

    def settle(rows: Any, records: Any, now: int, *, mode: str = "claim") -> None:
        sealed(rows, records, now, mode=mode)
        out.put(("held", os.getpid(), [r.key_hash for r in records]))
        while True:  # until SIGKILL
            time.sleep(60)

    store.settle = settle
    store.take(_options(tasks), limit, now=_now(now_us))
    out.put(("done", os.getpid(), []))  # never reached


def _pump_child(
    redis_url: str,
    tasks: dict[str, dict[str, Any]],
    limit: int,
    now_us: int,
    barrier: Any,
    out: Any,
) -> None:
    store = _setup(redis_url)
    options = _options(tasks)
    taken: list[tuple[str, int]] = []
    errors: list[str] = []
    barrier.wait(timeout=60)
    try:
        while True:
            got = store.take(options, limit, now=_now(now_us))
            taken.extend((d.key_hash, d.seq) for d in got.dispatches)
            if not got.dispatches:
                break
    except Exception as exc:  # reported to the test, which fails on any
        errors.append(f"{type(exc).__name__}: {exc}")
    out.put((os.getpid(), taken, errors))


def kill_mid_batch(
    redis_url: str, tasks: dict[str, dict[str, Any]], *, limit: int, now_us: int
) -> list[str]:
    """Start a pump, SIGKILL it once it holds a batch (rows locked, counters sealed, nothing
    committed); returns the key hashes of that batch."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_held_child, args=(redis_url, tasks, limit, now_us, out))
    proc.start()
    try:
        what, pid, batch = out.get(timeout=120)
        assert (what, pid) == ("held", proc.pid), (what, pid)
    finally:
        proc.kill()
        proc.join(timeout=30)
    assert proc.exitcode == -9, f"the held pump exited with {proc.exitcode}"
    return batch


def pumps(
    redis_url: str,
    tasks: dict[str, dict[str, Any]],
    *,
    processes: int,
    limit: int,
    now_us: int,
    timeout: float = 120,
) -> list[tuple[list[tuple[str, int]], list[str]]]:
    """``processes`` pumps started together, each taking (``limit`` at a time) until a take
    gets nothing. Returns, per pump, the ``(key_hash, seq)`` it took and its errors."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_pump_child, args=(redis_url, tasks, limit, now_us, barrier, out))
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
        assert p.exitcode == 0, f"pump process exited with {p.exitcode}"
    return results
