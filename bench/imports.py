"""Imports at the speed of bare saves (issue 23 item 1): what one debounced ``post_save``
receiver adds to an import.

    scripts/bench imports     (starts throwaway Redis and PostgreSQL, then runs this)

``BENCH_IMPORT_N`` saves (100,000 by default) of distinct new rows (``Model(...).save()``, an
``INSERT`` each) in transactions of ``BENCH_IMPORT_TXN`` (1,000), on PostgreSQL:

- ``bare``: rows with no receiver (``NoopDoc``);
- ``redis`` / ``database``: rows with one debounced receiver on that store (``wait=1``), whose
  triggers go out in one batch per commit.

Each with the worker stopped (nothing runs; the triggers only reach the store;
``BENCH_IMPORT_ROUNDS`` rounds, 3 by default, the models in turn, the median kept), then with a
Celery worker draining (its pump publishes the flights as they fall due and its pool runs
them while the import goes on; ``BENCH_IMPORT_DRAIN_N`` saves, by default N), then the
autocommit loop (every save its own commit, so every trigger goes out alone;
``BENCH_IMPORT_AUTOCOMMIT_N``, by default N). Writes
``bench/results/imports.json`` and ``bench/results/imports.md`` with the load average before
and after each measure, since the machine may be shared.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.import_settings"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django_redis import get_redis_connection  # noqa: E402

from bench import import_tasks  # noqa: E402
from bench.celery_app import app  # noqa: E402, F401  (the broker this process publishes to)
from bench.models import BenchDoc, DatabaseStoreDoc, NoopDoc, RedisStoreDoc  # noqa: E402
from bench.procs import Worker  # noqa: E402
from django_debounce.models import DebounceDue, DebounceKey, DebounceRun  # noqa: E402

N = int(os.environ.get("BENCH_IMPORT_N", "100000"))
TXN = int(os.environ.get("BENCH_IMPORT_TXN", "1000"))
AUTOCOMMIT_N = int(os.environ.get("BENCH_IMPORT_AUTOCOMMIT_N", str(N)))
DRAIN_N = int(os.environ.get("BENCH_IMPORT_DRAIN_N", str(N)))
ROUNDS = int(os.environ.get("BENCH_IMPORT_ROUNDS", "3"))  # of the worker-stopped phase
TARGET = 1.5  # receiver / bare, per save
MODELS = {"bare": NoopDoc, "redis": RedisStoreDoc, "database": DatabaseStoreDoc}
OUT = ROOT / "bench" / "results"


def clean() -> None:
    with connection.cursor() as cursor:
        for model in (BenchDoc, DebounceRun, DebounceDue, DebounceKey):
            cursor.execute(f"TRUNCATE {model._meta.db_table} CASCADE")
    store = get_redis_connection("default")
    store.flushall()


def run_import(model: type, n: int, txn: int | None) -> dict[str, float]:
    """``n`` saves of new rows of ``model``, in transactions of ``txn`` (``None``: autocommit);
    seconds in all and microseconds per save, with the load average around it."""
    clean()
    load = os.getloadavg()[0]
    start = time.perf_counter()
    if txn is None:
        for i in range(n):
            model(contender="imports", scenario="auto", version=i).save()
    else:
        for first in range(0, n, txn):
            with transaction.atomic():
                for i in range(first, min(first + txn, n)):
                    model(contender="imports", scenario="txn", version=i).save()
    took = time.perf_counter() - start
    return {
        "saves": n,
        "seconds": round(took, 2),
        "us_per_save": round(took / n * 1e6, 1),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def measure(txn: int | None, n: int, log: str, rounds: int = 1) -> dict[str, dict[str, float]]:
    """Each model's import of ``n`` saves, ``rounds`` times in turn (bare, redis, database,
    bare, ...): the round of median us/save of each, with every round's figure beside it
    (the machine may be shared: one slow minute must not decide a ratio)."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in MODELS}
    for _round in range(rounds):
        for name, model in MODELS.items():
            got = run_import(model, n, txn)
            runs[name].append(got)
            print(f"{log:<26} {name:<9} {got['us_per_save']:>8.1f} us/save "
                  f"(load {got['load_before']:.2f})", flush=True)  # fmt: skip
    out = {}
    for name, got in runs.items():
        ordered = sorted(got, key=lambda r: r["us_per_save"])
        out[name] = dict(ordered[len(ordered) // 2], rounds=[r["us_per_save"] for r in got])
    for name in ("redis", "database"):
        out[name]["ratio"] = round(out[name]["us_per_save"] / out["bare"]["us_per_save"], 2)
    return out


def report(results: dict) -> str:
    lines = [
        "# Imports: one debounced post_save receiver against none",
        "",
        f"`scripts/bench imports` ({results['when']}, {results['machine']}): "
        f"{N:,} saves of new rows in transactions of {TXN:,} on PostgreSQL "
        f"(worker stopped: the median of {ROUNDS} rounds, each model in turn); "
        f"with the worker draining: {DRAIN_N:,} saves; "
        f"the autocommit loop: {AUTOCOMMIT_N:,} saves, each its own commit. "
        f"Target: receiver / bare at most {TARGET}x.",
        "",
        "| phase | bare us/save | redis us/save | x | database us/save | x | load avg (1 min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for phase, rows in results["phases"].items():
        loads = " / ".join(f"{rows[n]['load_before']:.2f}" for n in MODELS)
        lines.append(
            f"| {phase} | {rows['bare']['us_per_save']} | {rows['redis']['us_per_save']} "
            f"| {rows['redis']['ratio']} | {rows['database']['us_per_save']} "
            f"| {rows['database']['ratio']} | {loads} |"
        )
    lines += [
        "",
        "x: receiver / bare. Rounds of the worker-stopped phase, us/save: "
        + "; ".join(f"{n} {results['phases']['worker stopped'][n].get('rounds')}" for n in MODELS)
        + ". Load averages: before the bare, redis and database runs. With the "
        "worker draining, `runs` counts the runs the worker finished by the end of the "
        f"import: {results.get('drained', {})}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    call_command("migrate", verbosity=0)
    results: dict = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "n": N,
        "txn": TXN,
        "phases": {},
    }
    results["phases"]["worker stopped"] = measure(TXN, N, "worker stopped", ROUNDS)
    store = get_redis_connection("default")
    with tempfile.TemporaryDirectory() as tmp:
        worker = Worker(
            dict(os.environ, PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="bench.import_settings"),
            Path(tmp) / "worker.log",
            concurrency=2,
        )
        store.delete(import_tasks.READY)
        worker.start(lambda: store.get(import_tasks.READY))
        try:
            drained = {}
            phase = {}
            for name, model in MODELS.items():
                store.set(import_tasks.READY, 1)
                phase[name] = run_import(model, DRAIN_N, TXN)
                store.set(import_tasks.READY, 1)  # clean() flushed it
                drained[name] = int(store.get(import_tasks.RUNS) or 0)
                print(f"{'worker draining':<26} {name:<9} {phase[name]['us_per_save']:>8.1f} "
                      f"us/save, {drained[name]} runs done", flush=True)  # fmt: skip
            for name in ("redis", "database"):
                phase[name]["ratio"] = round(
                    phase[name]["us_per_save"] / phase["bare"]["us_per_save"], 2
                )
            results["phases"]["worker draining"] = phase
            results["drained"] = drained
        finally:
            worker.stop()
    results["phases"]["autocommit, worker stopped"] = measure(None, AUTOCOMMIT_N, "autocommit")
    clean()
    OUT.mkdir(exist_ok=True)
    (OUT / "imports.json").write_text(json.dumps(results, indent=2) + "\n")
    (OUT / "imports.md").write_text(report(results))
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
