"""How long the admin pages take with 100,000 keys and 1,000,000 runs in the tables.

    scripts/bench-admin                  (starts throwaway PostgreSQL, runs this on it and SQLite)
    BENCH_DB=sqlite python bench/admin_pages.py      (with DEBOUNCE_TEST_POSTGRES_URL set for pg)

Generates the rows (``BENCH_KEYS``, default 100000, and ``BENCH_RUNS``, default 1000000;
20 tasks; runs spread over the last 30 days; 1 % of the keys pending), runs ``ANALYZE``, then
times each page through Django's test client (the whole request: queries and template),
``BENCH_REPEAT`` times (default 5), and records the median and the number of queries.
The "30d" summary aggregates every one of the runs. Writes
``bench/results/admin_pages_<db>.json`` and ``.md``. Figures, not assertions: the test suite
never times anything.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DB = os.environ.get("BENCH_DB", "postgresql")
N_KEYS = int(os.environ.get("BENCH_KEYS", "100000"))
N_RUNS = int(os.environ.get("BENCH_RUNS", "1000000"))
REPEAT = int(os.environ.get("BENCH_REPEAT", "5"))
N_TASKS = 20


def configure() -> None:
    """Django settings for the benchmark database (a fresh one each time)."""
    from django.conf import settings

    if DB == "postgresql":
        pg = urlparse(os.environ["DEBOUNCE_TEST_POSTGRES_URL"])
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "bench_admin",
            "USER": pg.username or "postgres",
            "HOST": pg.hostname,
            "PORT": pg.port,
        }
        import psycopg

        admin_url = f"postgresql://{pg.username or 'postgres'}@{pg.hostname}:{pg.port}/postgres"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS bench_admin")
            conn.execute("CREATE DATABASE bench_admin")
    elif DB == "sqlite":
        path = Path(tempfile.mkdtemp(prefix="debounce-bench-")) / "bench.sqlite3"
        database = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(path),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL;",
                "timeout": 30,
            },
        }
    else:
        raise SystemExit(f"BENCH_DB must be postgresql or sqlite, not {DB!r}")
    settings.configure(
        SECRET_KEY="bench",
        DEBUG=False,
        USE_TZ=True,
        TIME_ZONE="UTC",
        ALLOWED_HOSTS=["testserver"],
        ROOT_URLCONF="tests.urls",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django_debounce",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        DATABASES={"default": database},
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        DEBOUNCE_BACKEND="database",
        CELERY_TASK_ALWAYS_EAGER=True,
    )


def generate() -> float:
    """Insert the keys and runs with plain ``executemany`` batches; returns the seconds taken."""
    from django.db import connection, transaction
    from django.utils import timezone

    from django_debounce.models import DebounceKey, DebounceRun

    started = time.monotonic()
    rng = random.Random(42)
    now = timezone.now()
    adapt = connection.ops.adapt_datetimefield_value
    qn = connection.ops.quote_name
    key_cols = [
        "key",
        "key_hash",
        "task_name",
        "state",
        "pending",
        "flight_id",
        "first_trigger_at",
        "last_trigger_at",
        "due_at",
        "scheduled_seq",
        "scheduled",
        "overlap",
        "run_id",
        "run_triggers",
        "triggers",
        "runs",
        "merged",
        "cancelled",
        "last_run_at",
        "last_outcome",
        "store",
        "created_at",
        "updated_at",
    ]
    runs_per_key = max(N_RUNS // N_KEYS, 1)

    def key_row(i: int) -> tuple:
        pending = rng.randint(1, 50) if i % 100 == 0 else 0
        last = now - timedelta(seconds=rng.uniform(0, 30 * 86400))
        return (
            f'bench.task{i % N_TASKS}:{{"args": [{i}]}}',
            f"{i:064x}",
            f"bench.task{i % N_TASKS}",
            "pending" if pending else "idle",
            pending,
            runs_per_key + (1 if pending else 0),
            adapt(now - timedelta(seconds=30)) if pending else None,
            adapt(now - timedelta(seconds=2)) if pending else adapt(last),
            adapt(now + timedelta(seconds=rng.uniform(1, 60))) if pending else None,
            1,
            bool(pending),
            False,
            runs_per_key,
            0,
            runs_per_key * 4 + pending,
            runs_per_key,
            runs_per_key * 3,
            0,
            adapt(last),
            "success",
            "database",
            adapt(now - timedelta(days=31)),
            adapt(last),
        )

    run_cols = [
        "debounce_key_id",
        "task_name",
        "store",
        "flight_id",
        "run_id",
        "triggers",
        "first_trigger_at",
        "last_trigger_at",
        "due_at",
        "started_at",
        "delay",
        "finished_at",
        "outcome",
        "error",
    ]

    def insert(model: Any, cols: list[str], rows: list[tuple]) -> None:
        # Every other column gets its field's default (fields added by later migrations too).
        rest = [
            f for f in model._meta.concrete_fields if not f.primary_key and f.column not in cols
        ]
        tail = tuple(f.get_db_prep_save(f.get_default(), connection) for f in rest)
        names = [*cols, *(f.column for f in rest)]
        sql = (
            f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(c) for c in names)}) "
            f"VALUES ({', '.join(['%s'] * len(names))})"
        )
        with connection.cursor() as cursor:
            cursor.executemany(sql, [row + tail for row in rows])

    batch = 20000
    with transaction.atomic():
        for lo in range(0, N_KEYS, batch):
            insert(
                DebounceKey,
                key_cols,
                [key_row(i) for i in range(lo, min(lo + batch, N_KEYS))],
            )
    first_pk = DebounceKey.objects.order_by("pk").values_list("pk", flat=True).first()
    outcomes = ["success"] * 97 + ["failure"] * 2 + ["lost"]
    with transaction.atomic():
        for lo in range(0, N_RUNS, batch):
            rows = []
            for j in range(lo, min(lo + batch, N_RUNS)):
                k = j % N_KEYS
                start = now - timedelta(seconds=rng.uniform(0, 30 * 86400))
                delay = rng.lognormvariate(1.0, 1.2)
                triggers = 1 + int(rng.expovariate(0.25))
                outcome = outcomes[rng.randrange(100)]
                rows.append(
                    (
                        first_pk + k,
                        f"bench.task{k % N_TASKS}",
                        "database",
                        j // N_KEYS + 1,
                        j // N_KEYS + 1,
                        triggers,
                        adapt(start - timedelta(seconds=delay + 5)),
                        adapt(start - timedelta(seconds=delay)),
                        adapt(start),
                        adapt(start),
                        delay,
                        adapt(start + timedelta(seconds=0.2)),
                        outcome,
                        "boom" if outcome == "failure" else "",
                    )
                )
            insert(DebounceRun, run_cols, rows)
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            cursor.execute("ANALYZE")
            return time.monotonic() - started
        # As autovacuum leaves a table in steady use: statistics, and the visibility map that
        # index-only scans need. A VACUUM cannot mark pages all-visible while another
        # transaction (an autovacuum ANALYZE of the keys, say) still holds an older snapshot,
        # so it is repeated until the map covers the table.
        for _attempt in range(30):
            cursor.execute("VACUUM ANALYZE")
            cursor.execute(
                "SELECT relallvisible::float / GREATEST(relpages, 1) FROM pg_class "
                "WHERE relname = %s",
                [DebounceRun._meta.db_table],
            )
            if cursor.fetchone()[0] >= 0.99:
                break
            time.sleep(1)
    return time.monotonic() - started


def measure() -> dict:
    """Time the admin pages; returns the figures."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from django_debounce.models import DebounceKey

    client = Client()
    client.force_login(User.objects.create_superuser("bench", "b@example.com", "pw"))
    pending_key = DebounceKey.objects.filter(state="pending").values_list("pk", flat=True).first()
    busy_key = DebounceKey.objects.order_by("pk").values_list("pk", flat=True).first()
    summary = reverse("admin:django_debounce_debouncekey_summary")
    keys = reverse("admin:django_debounce_debouncekey_changelist")
    runs = reverse("admin:django_debounce_debouncerun_changelist")
    pages = {
        "summary 24h": (summary, {"period": "24h"}),
        "summary 7d": (summary, {"period": "7d"}),
        "summary 30d (all runs)": (summary, {"period": "30d"}),
        "keys list": (keys, {}),
        "keys list, pending filter": (keys, {"state": "pending"}),
        "keys list, task filter": (keys, {"task": "bench.task3"}),
        "keys list, search": (keys, {"q": 'task7:{"args": [4'}),
        "key page (recent runs)": (
            reverse("admin:django_debounce_debouncekey_change", args=[busy_key]),
            {},
        ),
        "pending key page": (
            reverse("admin:django_debounce_debouncekey_change", args=[pending_key]),
            {},
        ),
        "runs list": (runs, {}),
        "runs list, failures of one task": (runs, {"outcome": "failure", "task": "bench.task3"}),
    }
    out = {}
    for name, (url, params) in pages.items():
        client.get(url, params)  # warm the caches once
        times, db_times = [], []
        queries = 0
        for _ in range(REPEAT):
            with CaptureQueriesContext(connection) as ctx:
                t0 = time.perf_counter()
                response = client.get(url, params)
                times.append(time.perf_counter() - t0)
            assert response.status_code == 200, (name, response.status_code)
            queries = len(ctx.captured_queries)
            db_times.append(sum(float(q["time"]) for q in ctx.captured_queries))
        out[name] = {
            "median_ms": round(statistics.median(times) * 1000, 1),
            "db_median_ms": round(statistics.median(db_times) * 1000, 1),
            "queries": queries,
        }
        fig = out[name]
        print(
            f"{name:36} {fig['median_ms']:9.1f} ms (database {fig['db_median_ms']:8.1f})"
            f"  {queries:3d} queries",
            flush=True,
        )
    return out


def main() -> None:
    configure()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    print(f"generating {N_KEYS} keys and {N_RUNS} runs on {DB} ...", flush=True)
    seconds = generate()
    print(f"generated in {seconds:.0f} s", flush=True)
    load_before = os.getloadavg()[0]
    figures = measure()
    load_after = os.getloadavg()[0]
    result = {
        "database": DB,
        "server": str(connection.pg_version)  # type: ignore[attr-defined]
        if DB == "postgresql"
        else __import__("sqlite3").sqlite_version,
        "keys": N_KEYS,
        "runs": N_RUNS,
        "repeat": REPEAT,
        "pages": figures,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": [round(load_before, 1), round(load_after, 1)],
    }
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / f"admin_pages_{DB}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "| page | median ms | of which database | queries |",
        "|---|---|---|---|",
        *(
            f"| {name} | {f['median_ms']} | {f['db_median_ms']} | {f['queries']} |"
            for name, f in figures.items()
        ),
        "",
        f"{DB} ({result['server']}), {N_KEYS} keys, {N_RUNS} runs over 30 days, median of "
        f"{REPEAT} requests through Django's test client, {result['when']}, Python "
        f"{result['python']}, {result['cpus']} CPUs, load average {load_before:.1f} before and "
        f"{load_after:.1f} after (a shared machine); command: scripts/bench-admin"
        + (
            ". SQLite runs a query while its rows are fetched, after the time Django records "
            "for it: its database column undercounts."
            if DB == "sqlite"
            else ""
        ),
    ]
    (results / f"admin_pages_{DB}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
