"""Per-trigger cost of ``trigger()`` on each store, against its limits, in one run.

    scripts/bench            (starts throwaway Redis and PostgreSQL, then runs this)

Measures, on the same servers and in interleaved rounds (so machine noise hits all alike):

- ``redis_trigger``: a merged ``trigger()`` on the Redis store (one EVALSHA);
- ``redis_incr``: raw redis-py ``INCR`` on the same server (the floor);
- ``handwritten``: the common snippet, ``INCR`` plus ``apply_async(countdown=...)`` per trigger;
- ``db_trigger``: a merged ``trigger()`` on the database store, PostgreSQL;
- ``pg_update``: one ``UPDATE ... SET n = n + 1`` on a row of the same table (the floor).

Writes ``bench/results/trigger_cost.json`` and ``bench/results/trigger_cost.md``; the ratios
are medians over rounds of (variant time / limit time) within a round.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import django  # noqa: E402

django.setup()

from celery import Celery, shared_task  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import override_settings  # noqa: E402
from django_redis import get_redis_connection  # noqa: E402

from django_debounce import debounced_task  # noqa: E402
from django_debounce.keys import key_hash  # noqa: E402
from django_debounce.models import DebounceKey  # noqa: E402

app = Celery("bench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.set_default()

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))
N = int(os.environ.get("BENCH_N", "1500"))
TARGETS = {
    "redis_trigger / redis_incr": ("<=", 1.3),
    "handwritten / redis_trigger": (">=", 4.0),
    "db_trigger / pg_update": ("<=", 2.0),
}


@debounced_task(wait=3600, name="bench.reindex")
def reindex(item_id: int) -> None:
    """The debounced task under test (never runs here: every trigger after the first merges)."""


@shared_task(name="bench.reindex_plain")
def reindex_plain(item_id: int) -> None:
    """The task of the hand-written pattern."""


def per_op(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def main() -> int:
    call_command("migrate", verbosity=0)
    DebounceKey.objects.all().delete()
    redis = get_redis_connection("default")
    redis.flushdb()
    broker = app.connection_for_write()
    broker.default_channel.client.flushdb()

    # One open flight per store; every measured trigger merges into it.
    with override_settings(DEBOUNCE_BACKEND="redis"):
        reindex.trigger(1)
    with override_settings(DEBOUNCE_BACKEND="database"):
        reindex.trigger(2)
    row = DebounceKey.objects.get(key_hash=key_hash(reindex.name, reindex.resolve((2,), {})[0]))
    floor_pk = DebounceKey.objects.create(
        key="floor", key_hash="f" * 64, task_name="bench.floor"
    ).pk
    table = DebounceKey._meta.db_table

    def redis_trigger():
        reindex.trigger(1)

    def db_trigger():
        reindex.trigger(2)

    def redis_incr():
        redis.incr("bench:counter")

    def handwritten():
        redis.incr("bench:hand")
        redis.expire("bench:hand", 60)
        reindex_plain.apply_async((3,), countdown=30)

    cursor = connection.cursor()

    def pg_update():
        cursor.execute(f"UPDATE {table} SET triggers = triggers + 1 WHERE id = %s", [floor_pk])

    variants = {"redis_incr": redis_incr, "pg_update": pg_update, "handwritten": handwritten}
    samples: dict[str, list[float]] = {
        name: [] for name in ("redis_trigger", "db_trigger", *variants)
    }
    with override_settings(DEBOUNCE_BACKEND="redis"):
        per_op(redis_trigger, 200)
    with override_settings(DEBOUNCE_BACKEND="database"):
        per_op(db_trigger, 200)
    for fn in variants.values():
        per_op(fn, 200)
    for _ in range(ROUNDS):
        with override_settings(DEBOUNCE_BACKEND="redis"):
            samples["redis_trigger"].append(per_op(redis_trigger, N))
        with override_settings(DEBOUNCE_BACKEND="database"):
            samples["db_trigger"].append(per_op(db_trigger, N))
        for name, fn in variants.items():
            samples[name].append(per_op(fn, N if name != "handwritten" else N // 3))

    row.refresh_from_db()
    redis_pending = int(
        redis.hget(f"debounce:{{{key_hash(reindex.name, reindex.resolve((1,), {})[0])}}}", "p")
    )
    expected = 1 + 200 + ROUNDS * N
    checks = {
        "redis pending == triggers made": redis_pending == expected,
        "database pending == triggers made": row.pending == expected,
    }

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(samples[a], samples[b], strict=True))

    ratios = {name: ratio(*name.split(" / ")) for name in TARGETS}
    met = {
        name: (value <= TARGETS[name][1] if TARGETS[name][0] == "<=" else value >= TARGETS[name][1])
        for name, value in ratios.items()
    }
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "rounds": ROUNDS,
        "n": N,
        "median_us": {k: round(statistics.median(v) * 1e6, 1) for k, v in samples.items()},
        "ratios": {k: round(v, 2) for k, v in ratios.items()},
        "targets": {k: f"{op} {limit}" for k, (op, limit) in TARGETS.items()},
        "targets_met": met,
        "checks": checks,
    }
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "trigger_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["| variant | median per trigger (µs) |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in result["median_us"].items()]
    lines += ["", "| ratio | measured | target | met |", "|---|---|---|---|"]
    lines += [
        f"| {k} | {result['ratios'][k]} | {result['targets'][k]} | {'yes' if met[k] else 'NO'} |"
        for k in TARGETS
    ]
    lines += [
        "",
        f"{ROUNDS} rounds of {N} triggers, {result['when']}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; command: scripts/bench",
    ]
    (out / "trigger_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for name, ok in checks.items():
        print(f"check: {name}: {'ok' if ok else 'FAILED'}")
    broker.default_channel.client.flushdb()
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
