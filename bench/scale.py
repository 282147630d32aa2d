"""Dispatch at scale: pending keys, the pump, idle cost, throughput and a backlog, in one run.

    scripts/bench scale       (everything it needs it starts itself, and stops)

The stores keep one record per key (docs/design.md, "One record per key"): both keep every
key's lifecycle in its ``DebounceKey`` row and its ``DebounceDue`` entry, and the Redis store adds
a counter hash per key that absorbs merged triggers.

Starts its own servers: three Redis servers (the Redis store's, so ``INFO commandstats`` counts
this app's commands alone; the Celery broker's, so ``LPUSH`` counts the messages; and a stats
server that is never measured), PostgreSQL 15 at its default settings (only
``listen_addresses``, the port and the socket directory are set, plus
``shared_preload_libraries = 'pg_stat_statements'`` so that SQL statements can be counted),
and for figure 7 a 3-master Redis Cluster; then real prefork Celery workers
(``bench.celery_app`` with ``bench.scale_settings``).

1. Pending keys: ``REDIS_KEYS`` keys of a ``debounced_task`` with one int argument (wait
   3,600 s) on the Redis store, ``RECEIVER_KEYS`` keys of a ``post_save`` receiver, and
   ``DB_KEYS`` on the database store, all made with ``trigger_many``: fill rate (rows
   included), ``trigger_many`` alone on 5,000 new keys, Redis bytes per pending key (its
   counter: ``MEMORY USAGE`` of samples; ``INFO memory`` delta), PostgreSQL bytes per row,
   a real worker's memory before and after, and the broker messages held for those keys.
2. Meanwhile, a probe: every 2 s a trigger of a ``wait=1`` key and of a ``wait=3`` key on each
   store (at least ``PROBES`` each): trigger-to-start latency, and which path each took.
3. A pump tick (``Pump().tick()``, nothing due) at 1,000 keys and at the full scale; Redis
   commands (and SQL statements, and new PostgreSQL sessions) per second per idle worker,
   with 1 and 3 workers, and with 1 and 50 registered debounced tasks.
4. Throughput at ``--concurrency 1``: ``TP_KEYS`` due keys, bare Celery task / debounced empty
   body / bare, ``REPEATS`` times per store, the pump publishing in the same worker; Redis
   commands, SQL statements and new sessions per run, and the worker's CPU time per thread.
5. Backlog: ``BACKLOG_KEYS`` flights come due while no worker runs, then one starts: messages
   published per flight (the broker's ``LPUSH`` count), drain rate, and the broker queue's
   depth (sampled every 10 ms) against ``DEBOUNCE_PUMP_QUEUE_CAP``.
6. Redis restarted empty: ``RESTART_KEYS`` flights pending on the Redis store (some with
   merged triggers in their counters), the store's Redis killed and started again empty
   before they come due: every flight runs once, within its wait plus 1.2x the time the
   store takes to drain that many runs at the backlog's rate.
7. The 3-master Redis Cluster: an idle worker with the store on the cluster, commands per node
   (``INFO commandstats`` of each node) per pump tick.

Writes ``bench/results/scale.json`` (every figure as ``{name, value, unit, baseline, target,
met}``, the load average before and after, and every measurement behind them),
``scale.md`` and ``scale.svg``. Placement: with two CPUs or more, the servers on the first CPU
and this process with its workers on the second (``BENCH_PLACEMENT=unpinned`` leaves it to the
scheduler). Environment (for trials; the defaults are the issue's scale): ``BENCH_SCALE_REDIS_KEYS``
(1,000,000), ``BENCH_SCALE_RECEIVER_KEYS`` (100,000), ``BENCH_SCALE_DB_KEYS`` (100,000),
``BENCH_SCALE_PROBES`` (200), ``BENCH_SCALE_IDLE_SECONDS`` (60), ``BENCH_SCALE_TP_KEYS``
(5,000), ``BENCH_SCALE_REPEATS`` (3), ``BENCH_SCALE_BACKLOG_KEYS`` (10,000),
``BENCH_SCALE_RESTART_KEYS`` (100,000), ``BENCH_SCALE_CLUSTER_KEYS`` (10,000),
``BENCH_SCALE_OUT`` (the results directory).
"""

from __future__ import annotations

import bisect
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import (  # noqa: E402
    BenchError,
    PostgresServer,
    RedisCluster,
    RedisServer,
    Worker,
    pin_tree,
    tree,
)
from bench.report import _pct, _r  # noqa: E402  (percentile and rounding, shared)


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


REDIS_KEYS = _int("BENCH_SCALE_REDIS_KEYS", 1_000_000)
RECEIVER_KEYS = _int("BENCH_SCALE_RECEIVER_KEYS", 100_000)
DB_KEYS = _int("BENCH_SCALE_DB_KEYS", 100_000)
BASE_KEYS = 1000  # the pump tick and idle cost "at 1,000 keys", before the fill
ALONE_KEYS = 5000  # trigger_many alone, one call
SAVED_KEYS = 1000  # receiver keys made by post_save itself (the compact payload [pk])
PROBES = _int("BENCH_SCALE_PROBES", 200)
PROBE_EVERY = 2.0
IDLE_SECONDS = float(os.environ.get("BENCH_SCALE_IDLE_SECONDS", "60"))
TP_KEYS = _int("BENCH_SCALE_TP_KEYS", 5000)
REPEATS = _int("BENCH_SCALE_REPEATS", 3)
BACKLOG_KEYS = _int("BENCH_SCALE_BACKLOG_KEYS", 10_000)
RESTART_KEYS = _int("BENCH_SCALE_RESTART_KEYS", 100_000)
CLUSTER_KEYS = _int("BENCH_SCALE_CLUSTER_KEYS", 10_000)
IDLE_TASK_COUNTS = (1, 50)  # registered debounced tasks of the idle phase by task count
IDLE_TASK_KEYS = 20  # pending keys of each of them
CHUNK = 10_000  # items per trigger_many call while filling
DB_REUSE_MAX = 1000
QUEUE = "bench"
RUN_TIMEOUT = float(os.environ.get("BENCH_SCALE_RUN_TIMEOUT", "600"))

# Commands only clients send (the merge, open and seal scripts never do); TIME is sent by both
# (see client_commands). The HMGETs of a live view (``counted``) are counted with the scripts'.
CLIENT_ONLY = {"evalsha", "eval", "script|load", "ping", "hello", "select", "client|setinfo"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- what the bodies noted --------------------------------------------------------------------


class RunLog:
    """The run files the bodies append to (``bench/scale_tasks.note``), read incrementally."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: dict[str, int] = {}
        self.by_tag: dict[str, list[tuple[str, float]]] = defaultdict(list)

    def poll(self) -> None:
        for path in self.directory.iterdir():
            offset = self.offsets.get(path.name, 0)
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path.name] = offset + end
            for line in data[:end].decode().splitlines():
                tag, key, at = line.split(" ")
                self.by_tag[tag].append((key, float(at)))

    def count(self, tag: str) -> int:
        self.poll()
        return len(self.by_tag[tag])

    def take(self, tag: str) -> list[tuple[str, float]]:
        self.poll()
        return self.by_tag.pop(tag, [])

    def wait(self, tag: str, n: int, timeout: float = RUN_TIMEOUT) -> list[tuple[str, float]]:
        """Wait until ``n`` runs of ``tag`` were noted (or the timeout); returns and forgets
        them. Raises ``BenchError`` on the timeout."""
        deadline = time.monotonic() + timeout
        while self.count(tag) < n:
            if time.monotonic() > deadline:
                raise BenchError(f"only {self.count(tag)} of {n} runs of {tag} in {timeout:.0f}s")
            time.sleep(0.05)
        return self.take(tag)


# -- counters of the servers and the workers ------------------------------------------------


def commandstats(client: Any) -> dict[str, int]:
    """Calls per command since the server started (``INFO`` itself left out)."""
    out = {}
    for name, value in client.info("commandstats").items():
        command = name.removeprefix("cmdstat_")
        if command != "info" and not command.startswith("config"):
            out[command] = int(value["calls"])
    return out


def diff(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def client_commands(calls: dict[str, int]) -> dict[str, int]:
    """The commands clients sent, from a commandstats delta, which also counts the commands
    the Lua scripts run: EVALSHA, the other commands only clients send, and the TIME calls
    beyond one per script (every script of this app reads the clock once)."""
    scripts = calls.get("evalsha", 0) + calls.get("eval", 0)
    others = sum(v for k, v in calls.items() if k in CLIENT_ONLY and k not in ("evalsha", "eval"))
    others += max(calls.get("time", 0) - scripts, 0)
    return {"evalsha": scripts, "other": others, "total": scripts + others}


class Postgres:
    """A monitoring session of its own: ``pg_stat_database`` and ``pg_stat_statements``."""

    FIELDS = (
        "xact_commit",
        "xact_rollback",
        "tup_returned",
        "tup_fetched",
        "tup_inserted",
        "tup_updated",
        "tup_deleted",
        "sessions",
    )

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)

    def snapshot(self) -> dict[str, Any]:
        with self.conn.cursor() as cur:
            cur.execute(
                f"SELECT {', '.join(self.FIELDS)} FROM pg_stat_database "
                "WHERE datname = current_database()"
            )
            row = cur.fetchone()
            assert row is not None
            cur.execute(
                "SELECT queryid, calls, total_exec_time, query FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            statements = {
                r[0]: (int(r[1]), float(r[2]), r[3])
                for r in cur.fetchall()
                if "pg_stat_" not in r[3] and "pg_total_relation_size" not in r[3]
            }
        return {"db": dict(zip(self.FIELDS, (int(v) for v in row), strict=True)), "st": statements}

    @staticmethod
    def delta(after: dict[str, Any], before: dict[str, Any], top: int = 8) -> dict[str, Any]:
        """Counter deltas; ``statements``: SQL statements clients sent (pg_stat_statements
        calls, BEGIN and COMMIT included; the foreign key checks PostgreSQL runs itself are
        counted apart); ``top``: the statements with most calls."""
        db = {k: after["db"][k] - before["db"][k] for k in Postgres.FIELDS}
        rows, internal = [], 0
        for qid, (calls, ms, query) in after["st"].items():
            calls0, ms0, _q = before["st"].get(qid, (0, 0.0, ""))
            if not calls - calls0:
                continue
            if "FOR KEY SHARE OF x" in query:  # a foreign key check, run by the server itself
                internal += calls - calls0
                continue
            rows.append((calls - calls0, ms - ms0, " ".join(query.split())[:160]))
        rows.sort(reverse=True)
        return {
            **db,
            "statements": sum(r[0] for r in rows),
            "foreign_key_checks": internal,
            "statement_ms": round(sum(r[1] for r in rows), 1),
            "top": [{"calls": c, "ms": round(m, 1), "query": q} for c, m, q in rows[:top]],
        }

    def scalar(self, sql: str, params: Iterable[Any] = ()) -> Any:
        with self.conn.cursor() as cur:
            cur.execute(sql, list(params))
            if cur.description is None:
                return None
            row = cur.fetchone()
            return row[0] if row else None


CLK = os.sysconf("SC_CLK_TCK")


def cpu_by_thread(worker: Worker, names: dict[str, str]) -> dict[str, float]:
    """CPU seconds so far of each thread of the worker's main process (named as its Python
    thread is) and of its pool processes together."""
    assert worker.proc is not None
    main = worker.proc.pid
    out: dict[str, float] = defaultdict(float)
    for pid in tree(main):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / CLK
            if pid != main:
                name = "pool processes"
            else:
                name = names.get(tid, "other threads")
                name = "consumer (MainThread)" if name == "MainThread" else name
            out[name] += seconds
    return dict(out)


# -- the run ----------------------------------------------------------------------------------


class Scale:
    """Servers, workers and clients of one run; ``close()`` stops everything it started."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.servers = {n: RedisServer(n, tmp) for n in ("store", "broker", "stats")}
        self.pg = PostgresServer(tmp, {"shared_preload_libraries": "'pg_stat_statements'"})
        self.runs_dir = tmp / "runs"
        self.runs_dir.mkdir()
        self.log = RunLog(self.runs_dir)
        self.workers: list[Worker] = []
        self.cluster: RedisCluster | None = None
        self.threads: dict[str, dict[str, str]] = {}
        self.placement = "left to the scheduler"
        self.server_cpus: set[int] | None = None
        self._items = 10_000_000  # fresh int arguments for keys not made yet

    def items(self, n: int) -> range:
        start = self._items
        self._items += n
        return range(start, start + n)

    def start(self) -> None:
        for server in self.servers.values():
            server.start()
        self.pg.start()
        os.environ.update(
            {
                "BENCH_STORE_URL": self.servers["store"].url,
                "BENCH_BROKER_URL": self.servers["broker"].url,
                "BENCH_STATS_URL": self.servers["stats"].url,
                "DEBOUNCE_TEST_REDIS_URL": self.servers["store"].url,
                "DEBOUNCE_TEST_POSTGRES_URL": self.pg.url,
                "DJANGO_SETTINGS_MODULE": "bench.scale_settings",
                "BENCH_RUNS_DIR": str(self.runs_dir),
            }
        )
        os.environ.pop("BENCH_DB_REUSE_MAX", None)
        self.placement = self.pin()
        import django

        django.setup()
        import redis
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        self.pgmon = Postgres(self.pg.url)
        self.pgmon.scalar("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.store = redis.Redis.from_url(self.servers["store"].url)
        self.broker = redis.Redis.from_url(self.servers["broker"].url)
        self.stats = redis.Redis.from_url(self.servers["stats"].url)
        import bench.scale_tasks as tasks

        self.tasks = tasks

    def pin(self) -> str:
        """Servers on the first CPU, this process (and so the workers it starts, which inherit
        its affinity) on the second; PostgreSQL's backends inherit the postmaster's."""
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if os.environ.get("BENCH_PLACEMENT") == "unpinned" or len(cpus) < 2:
            return "left to the scheduler"
        server, client = {cpus[0]}, {cpus[1]}
        self.server_cpus = server
        try:
            for s in self.servers.values():
                assert s.proc is not None
                pin_tree(s.proc.pid, server)
            pin_tree(self.pg.postmaster_pid(), server)
            os.sched_setaffinity(0, client)
        except OSError as exc:
            return f"not pinned ({exc})"
        return (
            f"the Redis servers and PostgreSQL on CPU {cpus[0]}; this process, its workers "
            f"and their pool processes on CPU {cpus[1]}"
        )

    def start_worker(
        self,
        name: str,
        concurrency: int,
        reuse: int | None = None,
        extra: dict[str, str] | None = None,
    ) -> Worker:
        env = dict(os.environ, PYTHONPATH=str(ROOT), **(extra or {}))
        env.pop("BENCH_DB_REUSE_MAX", None)
        if reuse:
            env["BENCH_DB_REUSE_MAX"] = str(reuse)
        worker = Worker(
            env, self.tmp / f"worker-{name}.log", concurrency, name=f"scale-{name}@localhost"
        )
        self.stats.delete(f"ready:{worker.name}", f"threads:{worker.name}")
        self.workers.append(worker)
        worker.start(lambda: self.stats.get(f"ready:{worker.name}"))
        self.threads[worker.name] = {
            k.decode(): v.decode() for k, v in self.stats.hgetall(f"threads:{worker.name}").items()
        }
        return worker

    def stop_worker(self, worker: Worker) -> None:
        worker.stop()
        self.workers.remove(worker)

    def restart_store(self) -> float:
        """Kill the Redis store's server (SIGKILL: nothing saved, it keeps no file) and start
        it again, empty, on the same port; returns the time it answered again."""
        server = self.servers["store"]
        server.stop()
        server.start()
        if self.server_cpus is not None and server.proc is not None:
            pin_tree(server.proc.pid, self.server_cpus)
        self.store.connection_pool.disconnect()
        return time.time()

    def cpu(self, worker: Worker) -> dict[str, float]:
        return cpu_by_thread(worker, self.threads.get(worker.name, {}))

    def close(self) -> None:
        for worker in list(self.workers):
            try:
                worker.stop()
            except Exception as exc:  # keep stopping the rest
                log(f"stop failed: {exc}")
        stops = [self.pg.stop, *(s.stop for s in self.servers.values())]
        if self.cluster is not None:
            stops.append(self.cluster.stop)
        for stop in stops:
            try:
                stop()
            except Exception as exc:
                log(f"stop failed: {exc}")

    # -- measurements -----------------------------------------------------------------------

    def used_memory(self) -> int:
        return int(self.store.info("memory")["used_memory"])

    def table_bytes(self) -> dict[str, int]:
        from django_debounce.models import DebounceDue, DebounceKey

        return {
            name: int(self.pgmon.scalar("SELECT pg_total_relation_size(%s)", [table]))
            for name, table in (
                ("key", DebounceKey._meta.db_table),
                ("due", DebounceDue._meta.db_table),
            )
        }

    def fill(self, task: Any, items: Iterable[Any], what: str) -> dict[str, Any]:
        """``trigger_many`` over ``items`` in calls of ``CHUNK``; keys per second."""
        from django_debounce import trigger_many

        items = list(items)
        started = time.perf_counter()
        progress = []
        for i in range(0, len(items), CHUNK):
            trigger_many(task, items[i : i + CHUNK])
            done = min(i + CHUNK, len(items))
            progress.append((round(time.perf_counter() - started, 2), done))
            if len(progress) % 20 == 0:
                log(f"  {what}: {progress[-1][1]:,} keys in {progress[-1][0]:.0f}s")
        seconds = time.perf_counter() - started
        return {
            "keys": len(items),
            "seconds": round(seconds, 2),
            "keys_per_second": round(len(items) / seconds, 1),
            "progress": progress,
            "wall_start": time.time() - seconds,
            "wall_end": time.time(),
        }

    def key_hashes(self, task: Any, args: Iterable[tuple[Any, ...]]) -> list[str]:
        from django_debounce.keys import key_hash

        return [key_hash(task.name, task.resolve(a, {})[0]) for a in args]

    def redis_sizes(self, task: Any, hashes: list[str]) -> dict[str, Any]:
        """``MEMORY USAGE`` of the counters of ``hashes`` (a pending key's only Redis key: the
        due index is in the database), and one counter's fields."""
        backend = task.get_backend()
        pipe = self.store.pipeline(transaction=False)
        for h in hashes:
            pipe.memory_usage(backend.counter_key(h), samples=0)
        got = pipe.execute()
        sizes = [int(v) for v in got if v is not None]
        sample = self.store.hgetall(backend.counter_key(hashes[0])) if hashes else {}
        return {
            "counter_bytes_mean": _r(statistics.mean(sizes)) if sizes else None,
            "counter_bytes_max": max(sizes) if sizes else None,
            "counters_sampled": len(sizes),
            "keys_sampled": len(hashes),
            "sample_counter": {k.decode(): v.decode() for k, v in sample.items()},
            "sample_ttl_s": self.store.ttl(backend.counter_key(hashes[0])) if hashes else None,
        }

    def outstanding(self) -> dict[str, int]:
        """Broker messages queued (``LLEN``) and held by workers (the transport's ``unacked``
        hash), by task name."""
        by_task: dict[str, int] = defaultdict(int)
        raw = self.broker.lrange(QUEUE, 0, -1)
        held = self.broker.hvals("unacked")
        for item in raw:
            by_task[json.loads(item).get("headers", {}).get("task", "?")] += 1
        for item in held:
            by_task[json.loads(item)[0].get("headers", {}).get("task", "?")] += 1
        return {"queued": len(raw), "unacked": len(held), **by_task}


# -- the probe --------------------------------------------------------------------------------


class Probe(threading.Thread):
    """Every ``PROBE_EVERY`` seconds, one trigger of each probe task: the ``wait=1`` ones on
    one key, the ``wait=3`` ones round-robin on three keys (a key triggered every 2 s with
    wait=3 would never run). Notes each trigger's time and whether it was published at once
    (``TriggerResult.scheduled``: due within ``DEBOUNCE_PUMP_INTERVAL``)."""

    def __init__(self, probes: dict[str, Any]) -> None:
        super().__init__(name="probe", daemon=True)
        self.probes = probes
        self.samples: list[tuple[str, int, float, bool]] = []
        self.ticks = 0
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        from django.db import connection

        next_at = time.monotonic()
        try:
            while not self._stop_event.is_set():
                for name, task in self.probes.items():
                    key = 0 if name.startswith("probe1") else self.ticks % 3
                    at = time.time()
                    try:
                        result = task.trigger(key)
                    except Exception as exc:  # noted, and the run goes on
                        self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                        continue
                    self.samples.append((name, key, at, bool(result.scheduled)))
                self.ticks += 1
                next_at += PROBE_EVERY
                self._stop_event.wait(max(next_at - time.monotonic(), 0.0))
        finally:
            connection.close()

    def finish(self, ticks: int) -> None:
        while self.ticks < ticks:
            time.sleep(0.2)
        self._stop_event.set()
        self.join(timeout=30)


def probe_report(
    samples: list[tuple[str, int, float, bool]],
    runs: dict[str, list[tuple[str, float]]],
    fill_window: tuple[float, float],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sorted({s[0] for s in samples}):
        starts: dict[str, list[float]] = defaultdict(list)
        for key, at in runs.get(name, []):
            starts[key].append(at)
        for v in starts.values():
            v.sort()
        lat, during, after, direct, missing, series = [], [], [], 0, 0, []
        for _name, key, at, scheduled in (s for s in samples if s[0] == name):
            direct += scheduled
            ks = starts.get(str(key), [])
            i = bisect.bisect_right(ks, at)
            if i == len(ks):
                missing += 1
                continue
            delay = ks[i] - at
            lat.append(delay)
            series.append((round(at, 3), round(delay, 4)))
            (during if fill_window[0] <= at <= fill_window[1] else after).append(delay)
        n = len([s for s in samples if s[0] == name])
        out[name] = {
            "wait": 1 if name.startswith("probe1") else 3,
            "store": name.split("_", 1)[1],
            "samples": len(lat),
            "missing": missing,
            "path": "published at trigger (countdown)" if direct > n / 2 else "due index (pump)",
            "published_at_trigger": direct,
            "p50_s": _r(_pct(lat, 0.5), 4),
            "p90_s": _r(_pct(lat, 0.9), 4),
            "p99_s": _r(_pct(lat, 0.99), 4),
            "max_s": _r(max(lat), 4) if lat else None,
            "during_fill": {"samples": len(during), "p50_s": _r(_pct(during, 0.5), 4),
                            "p99_s": _r(_pct(during, 0.99), 4)},
            "after_fill": {"samples": len(after), "p50_s": _r(_pct(after, 0.5), 4),
                           "p99_s": _r(_pct(after, 0.99), 4)},
            "series": series,
        }  # fmt: skip
    return out


# -- phases -----------------------------------------------------------------------------------


def pump_ticks(s: Scale, n: int = 30) -> dict[str, Any]:
    """``Pump().tick()`` in this process (every debounced task of the benchmark registered,
    nothing due): time per tick, Redis commands and SQL statements per tick."""
    from django_debounce import registry
    from django_debounce.pump import Pump

    pump = Pump()
    pump.tick()  # connections made
    c0, p0 = commandstats(s.store), s.pgmon.snapshot()
    samples, cpu = [], []
    for _ in range(n):
        t0, c0_ = time.perf_counter(), time.thread_time()
        pump.tick()
        samples.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0_)
    c1, p1 = commandstats(s.store), s.pgmon.snapshot()
    calls = diff(c1, c0)
    pg = Postgres.delta(p1, p0)
    return {
        "ticks": n,
        "tasks": len(registry.all_tasks()),
        "median_ms": _r(statistics.median(samples) * 1e3, 2),
        "p90_ms": _r(_pct(samples, 0.9) * 1e3, 2),  # type: ignore[operator]
        "max_ms": _r(max(samples) * 1e3, 2),
        "min_ms": _r(min(samples) * 1e3, 2),
        "cpu_median_ms": _r(statistics.median(cpu) * 1e3, 2),
        "sql_server_ms_per_tick": _r(pg["statement_ms"] / n, 3),
        "redis_commands_per_tick": _r(sum(calls.values()) / n, 1),
        "redis_by_command": {k: round(v / n, 1) for k, v in calls.items()},
        "sql_statements_per_tick": _r(pg["statements"] / n, 1),
        "sql_top": pg["top"][:4],
    }


class QueueWatch(threading.Thread):
    """Samples the broker queue's depth (``LLEN``) every 10 ms until ``stop()``: its maximum,
    against ``DEBOUNCE_PUMP_QUEUE_CAP`` (the pump takes at most the room left under it)."""

    def __init__(self, url: str) -> None:
        import redis

        super().__init__(name="queue-watch", daemon=True)
        self.client = redis.Redis.from_url(url)
        self.max = 0
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.max = max(self.max, int(self.client.llen(QUEUE)))
            self.samples += 1
            self._stop_event.wait(0.01)

    def stop(self) -> dict[str, int]:
        self._stop_event.set()
        self.join(timeout=10)
        self.client.close()
        return {"max_depth": self.max, "samples": self.samples}


def idle(s: Scale, workers: list[Worker], seconds: float) -> dict[str, Any]:
    """Store commands, SQL statements and new PostgreSQL sessions per second per idle worker."""
    time.sleep(3)
    s.log.take("pg_session")
    c0, p0, t0 = commandstats(s.store), s.pgmon.snapshot(), time.monotonic()
    cpu0 = {w.name: s.cpu(w) for w in workers}
    time.sleep(seconds)
    c1, p1, t1 = commandstats(s.store), s.pgmon.snapshot(), time.monotonic()
    cpu1 = {w.name: s.cpu(w) for w in workers}
    span = t1 - t0
    calls = diff(c1, c0)
    pg = Postgres.delta(p1, p0)
    n = len(workers)
    sessions: dict[str, int] = defaultdict(int)
    for who, _at in s.log.take("pg_session"):
        sessions[who] += 1
    cpu = sum(sum(cpu1[w].values()) - sum(cpu0[w].values()) for w in cpu1)
    return {
        "workers": n,
        "seconds": round(span, 1),
        "redis_commands": sum(calls.values()),
        "redis_commands_per_worker_per_second": round(sum(calls.values()) / span / n, 2),
        "redis_by_command": calls,
        "sql_statements_per_worker_per_second": round(pg["statements"] / span / n, 2),
        "sql_transactions_per_worker_per_second": round(
            (pg["xact_commit"] + pg["xact_rollback"]) / span / n, 2
        ),
        "pg_sessions_per_worker_per_second": round(pg["sessions"] / span / n, 3),
        "pg_sessions_by_thread": dict(sessions),
        "worker_cpu_percent": round(100 * cpu / span / n, 2),
        "sql_top": pg["top"][:5],
    }


def publish_to_start(s: Scale, n: int = 50) -> dict[str, Any]:
    """Bare Celery task: publish to body start in the running worker (the probe's floor)."""
    lat = []
    for i in range(n):
        at = time.time()
        s.tasks.bare.delay(-1 - i)
        runs = s.log.wait("bare", 1, 30)
        lat.append(runs[0][1] - at)
        time.sleep(0.05)
    return {"samples": n, "p50_s": _r(_pct(lat, 0.5), 4), "p99_s": _r(_pct(lat, 0.99), 4)}


def pg_floor(s: Scale) -> dict[str, Any]:
    """What PostgreSQL at these settings gives for rows like a key's durable record, in a copy
    of its table (same columns and indexes): one row per autocommit transaction (the commit
    waits for the WAL flush), and 1,000 rows per statement."""
    from django_debounce.models import DebounceKey

    table = DebounceKey._meta.db_table
    cols = [f.column for f in DebounceKey._meta.concrete_fields if not f.primary_key]
    picked = ", ".join("%s" if c in ("key", "key_hash") else c for c in cols)
    template = s.pgmon.scalar(f"SELECT min(id) FROM {table}")
    s.pgmon.scalar("DROP TABLE IF EXISTS bench_scale_floor")
    s.pgmon.scalar(f"CREATE TABLE bench_scale_floor (LIKE {table} INCLUDING ALL)")
    insert = (
        f"INSERT INTO bench_scale_floor ({', '.join(cols)}) "
        f"SELECT {picked} FROM {table} WHERE id = {int(template)}"
    )
    single = 1000
    with s.pgmon.conn.cursor() as cur:
        t0 = time.perf_counter()
        for i in range(single):
            cur.execute(insert, [f"floor:{i}", f"{i:064x}"])
        one = time.perf_counter() - t0
        bulk = 50
        gen = picked.replace("%s", "'floor:' || g", 1).replace("%s", "lpad(to_hex(g), 64, '0')", 1)
        t0 = time.perf_counter()
        for b in range(bulk):
            cur.execute(
                f"INSERT INTO bench_scale_floor ({', '.join(cols)}) SELECT {gen} FROM {table}, "
                f"generate_series({(b + 1) * 1000}, {(b + 2) * 1000 - 1}) g "
                f"WHERE id = {int(template)}"
            )
        many = time.perf_counter() - t0
    s.pgmon.scalar("DROP TABLE bench_scale_floor")
    return {
        "one_row_per_transaction_per_second": round(single / one, 1),
        "rows_per_second_1000_per_statement": round(bulk * 1000 / many, 1),
    }


def redis_floor(s: Scale, n: int = 100_000) -> dict[str, Any]:
    """The same data without this app: per key a hash with the fields of a pending key's
    counter (``open.lua``: id, count, fingerprint, expiry, flight id, pending base) under its
    43-character id, with its expiry, written by redis-py pipelines of 1,000 keys, in database 1
    of the store server: keys per second and bytes."""
    import base64
    import hashlib

    import redis

    conn = s.store.connection_pool.connection_kwargs
    raw = redis.Redis(host=conn["host"], port=conn["port"], db=1)
    raw.flushdb()
    before = s.used_memory()
    now = int(time.time() * 1e6)
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        pipe = raw.pipeline(transaction=False)
        for i in range(start, min(n, start + 1000)):
            digest = hashlib.sha256(b"floor:%d" % i).digest()
            kid = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            fp = "3600000000::" + base64.b64encode(digest[:9]).decode()
            key = f"debounce:{kid}"
            pipe.hset(
                key,
                mapping={"i": now + i, "n": 0, "f": fp, "x": now + 3_603_000_000, "g": 1, "p": 1},
            )
            pipe.pexpire(key, 3_604_000)
        pipe.execute()
    seconds = time.perf_counter() - t0
    after = s.used_memory()
    raw.flushdb()
    raw.close()
    return {
        "keys": n,
        "keys_per_second": round(n / seconds, 1),
        "bytes_per_key": round((after - before) / n, 1),
    }


def phase_fill(s: Scale, out: dict[str, Any]) -> None:
    """Figures 1 and 2 (and the baselines at 1,000 keys of figure 3)."""
    t = s.tasks
    log(f"the first {BASE_KEYS:,} keys on each store")
    mem0 = s.used_memory()
    first_redis = s.fill(t.pending_redis, range(BASE_KEYS), "redis")
    first_db = s.fill(t.pending_database, range(BASE_KEYS), "database")
    tables_first = s.table_bytes()
    w1 = s.start_worker("w1", 2)
    time.sleep(5)
    out["worker_memory_before"] = w1.memory()
    log("pump tick and idle cost at 1,000 keys; bare publish-to-start")
    out["pump_1k"] = pump_ticks(s)
    out["idle_1k"] = idle(s, [w1], IDLE_SECONDS)
    out["publish_to_start"] = publish_to_start(s)

    # The receiver's keys before the million task keys: Redis's keyspace table doubles each
    # time the key count passes a power of two, 16 MiB at once past 2^20. Filled here, each
    # fill pays the table's growth over its own keys, and the million task keys pay the
    # doubling past 2^20 (filled after them, the receiver's delta carried it all).
    mem_r0 = s.used_memory()
    receiver = s.fill(t.pending_receiver, range(1, RECEIVER_KEYS + 1), "receiver")
    receiver_bytes = s.used_memory() - mem_r0
    receiver["bytes_per_key"] = round(receiver_bytes / RECEIVER_KEYS, 1)
    out["fill_receiver"] = receiver
    log(f"receiver: {RECEIVER_KEYS:,} keys at {receiver['keys_per_second']:,.0f}/s")

    log("filling, with the probe running")
    probe = Probe(t.PROBES)
    probe.start()
    fill_started = time.time()
    rest = s.fill(t.pending_redis, range(BASE_KEYS, REDIS_KEYS), "redis")
    mem1, tables1 = s.used_memory(), s.table_bytes()
    redis_fill = {
        "keys": REDIS_KEYS,
        "seconds": round(first_redis["seconds"] + rest["seconds"], 2),
        "progress": rest["progress"],
    }
    redis_fill["keys_per_second"] = round(REDIS_KEYS / redis_fill["seconds"], 1)
    redis_fill["bytes_per_key"] = round((mem1 - mem0 - receiver_bytes) / REDIS_KEYS, 1)
    # the rows of the Redis store's keys made since the first 1,000 of each store
    redis_fill["pg_bytes_per_row"] = round(
        (tables1["key"] - tables_first["key"]) / (REDIS_KEYS - BASE_KEYS), 1
    )
    out["fill_redis"] = redis_fill
    log(f"redis store: {REDIS_KEYS:,} keys at {redis_fill['keys_per_second']:,.0f}/s")

    tables2 = s.table_bytes()
    rest_db = s.fill(t.pending_database, range(BASE_KEYS, DB_KEYS), "database")
    tables3 = s.table_bytes()
    db_fill = {
        "keys": DB_KEYS,
        "seconds": round(first_db["seconds"] + rest_db["seconds"], 2),
        "progress": rest_db["progress"],
    }
    db_fill["keys_per_second"] = round(DB_KEYS / db_fill["seconds"], 1)
    rows = DB_KEYS - BASE_KEYS
    db_fill["pg_bytes_per_row_key"] = round((tables3["key"] - tables2["key"]) / rows, 1)
    db_fill["pg_bytes_per_row_due"] = round((tables3["due"] - tables2["due"]) / rows, 1)
    out["fill_database"] = db_fill
    fill_ended = time.time()
    log(f"database store: {DB_KEYS:,} keys at {db_fill['keys_per_second']:,.0f}/s")

    out["alone"] = {}
    for store, task in (("redis", t.pending_redis), ("database", t.pending_database)):
        one = s.fill(task, s.items(ALONE_KEYS), f"alone {store}")
        out["alone"][store] = {k: one[k] for k in ("keys", "seconds", "keys_per_second")}
    log(f"trigger_many alone: {out['alone']}")

    # receiver keys made by a save's post_save (the compact stored payload, [pk])
    from django.db.models.signals import post_save

    from bench.models import BenchDoc

    saved = range(RECEIVER_KEYS + 1, RECEIVER_KEYS + 1 + SAVED_KEYS)
    for pk in saved:
        post_save.send(
            sender=BenchDoc,
            instance=BenchDoc(pk=pk),
            created=False,
            update_fields=None,
            raw=False,
            using="default",
        )

    log(f"probe: {probe.ticks} ticks so far; it stops at {PROBES}")
    probe.finish(PROBES)
    out["probe_errors"] = probe.errors[:5]
    time.sleep(5)
    runs = {name: s.log.take(name) for name in t.PROBES}
    out["probe"] = probe_report(probe.samples, runs, (fill_started, fill_ended))
    out["fill_window"] = [fill_started, fill_ended]

    log("memory and broker at scale")
    sample = list(range(0, REDIS_KEYS, max(REDIS_KEYS // 2000, 1)))[:2000]
    out["sizes_redis"] = s.redis_sizes(
        t.pending_redis, s.key_hashes(t.pending_redis, [(i,) for i in sample])
    )
    rsample = list(range(1, RECEIVER_KEYS + 1, max(RECEIVER_KEYS // 1000, 1)))[:1000]
    out["sizes_receiver"] = s.redis_sizes(
        t.pending_receiver, s.key_hashes(t.pending_receiver, [(BenchDoc, pk) for pk in rsample])
    )
    out["sizes_receiver_saved"] = s.redis_sizes(
        t.pending_receiver, s.key_hashes(t.pending_receiver, [(BenchDoc, pk) for pk in saved])
    )
    out["pg_row_data_bytes"] = {
        store: _r(
            s.pgmon.scalar(
                "SELECT avg(pg_column_size(k.*)) FROM django_debounce_debouncekey k "
                "WHERE task_name = %s",
                [task.name],
            )
        )
        for store, task in (("redis", t.pending_redis), ("database", t.pending_database))
    }
    time.sleep(max(0.0, 20 - (time.time() - fill_ended)))  # pump ticks at scale
    out["worker_memory_after"] = w1.memory()
    out["outstanding"] = s.outstanding()
    out["pending_tasks"] = [t.pending_redis.name, t.pending_receiver.name, t.pending_database.name]
    out["keyspace"] = s.store.info("keyspace")
    out["w1"] = w1


def phase_idle(s: Scale, out: dict[str, Any]) -> None:
    w1 = out.pop("w1")
    log(f"idle: 1 worker, {IDLE_SECONDS:.0f}s")
    out["idle_1"] = idle(s, [w1], IDLE_SECONDS)
    extra = [s.start_worker(f"w{i}", 2) for i in (2, 3)]
    log(f"idle: 3 workers, {IDLE_SECONDS:.0f}s")
    out["idle_3"] = idle(s, [w1, *extra], IDLE_SECONDS)
    for w in extra:
        s.stop_worker(w)
    log("pump tick at scale")
    out["pump_full"] = pump_ticks(s)
    s.stop_worker(w1)


def _window(s: Scale, worker: Worker) -> dict[str, Any]:
    """Counters at the start or the end of a measured window; the sessions noted since the
    last call (the start of a window counts from here)."""
    sessions: dict[str, int] = defaultdict(int)
    for who, _at in s.log.take("pg_session"):
        sessions[who] += 1
    return {
        "sessions": dict(sessions),
        "store": commandstats(s.store),
        "broker": commandstats(s.broker),
        "pg": s.pgmon.snapshot(),
        "cpu": s.cpu(worker),
        "at": time.monotonic(),
    }


def _close(s: Scale, worker: Worker, w0: dict[str, Any], runs: list[tuple[str, float]]) -> dict:
    w1 = _window(s, worker)
    n = len(runs)
    starts = sorted(at for _k, at in runs)
    span = starts[-1] - starts[0] if n > 1 else float("nan")
    store = diff(w1["store"], w0["store"])
    broker = diff(w1["broker"], w0["broker"])
    pg = Postgres.delta(w1["pg"], w0["pg"])
    cpu = {k: round((v - w0["cpu"].get(k, 0.0)) / n * 1e6, 1) for k, v in w1["cpu"].items()}
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    sessions = w1["sessions"]
    pool_sessions = sum(v for k, v in sessions.items() if k.startswith("pool:"))
    return {
        "runs": n,
        "distinct_keys": len({k for k, _a in runs}),
        "seconds": round(span, 3),
        "runs_per_second": round(n / span, 1),
        "max_gap_s": _r(max(gaps), 3) if gaps else None,
        "gaps_over_50ms": sum(g > 0.05 for g in gaps),
        "store_commands_per_run": round(sum(store.values()) / n, 3),
        "store_client_commands_per_run": {
            k: round(v / n, 3) for k, v in client_commands(store).items()
        },
        "store_by_command_per_run": {k: round(v / n, 3) for k, v in store.items()},
        "broker_commands_per_run": round(sum(broker.values()) / n, 3),
        "broker_lpush_per_run": round(broker.get("lpush", 0) / n, 3),
        "sql_statements_per_run": round(pg["statements"] / n, 3),
        "sql_foreign_key_checks_per_run": round(pg["foreign_key_checks"] / n, 3),
        "sql_transactions_per_run": round((pg["xact_commit"] + pg["xact_rollback"]) / n, 3),
        "sql_tuples_written_per_run": round(
            (pg["tup_inserted"] + pg["tup_updated"] + pg["tup_deleted"]) / n, 3
        ),
        "pg_sessions": pg["sessions"],
        "pg_sessions_by_process": dict(sessions),
        "pg_sessions_pool_per_run": round(pool_sessions / n, 4),
        "pg_sessions_per_run": round(pg["sessions"] / n, 4),
        "sql_top": pg["top"],
        "worker_cpu_us_per_run": dict(sorted(cpu.items(), key=lambda kv: -kv[1])),
        "window_seconds": round(w1["at"] - w0["at"], 2),
    }


def bare_round(s: Scale, worker: Worker, n: int) -> dict[str, Any]:
    """``n`` bare messages queued while the worker does not consume, then consumed."""
    app = s.tasks.bare.app
    app.control.cancel_consumer(QUEUE, destination=[worker.name], reply=True, timeout=10)
    with app.producer_or_acquire() as producer:
        for i in range(n):
            s.tasks.bare.apply_async((i,), producer=producer)
    w0 = _window(s, worker)
    app.control.add_consumer(QUEUE, destination=[worker.name], reply=True, timeout=10)
    runs = s.log.wait("bare", n)
    return _close(s, worker, w0, runs)


def debounced_round(s: Scale, worker: Worker, store: str, n: int) -> dict[str, Any]:
    """``n`` keys triggered with ``trigger_many`` while the worker runs; they come due after
    the task's wait, and its pump publishes them."""
    from django_debounce import trigger_many

    task = s.tasks.THROUGHPUT[store]
    t0 = time.perf_counter()
    trigger_many(task, s.items(n))
    triggered = time.perf_counter() - t0
    w0 = _window(s, worker)
    runs = s.log.wait(task.name.split(".")[1], n)
    time.sleep(1)  # the last runs' finishes commit
    out = _close(s, worker, w0, runs)
    out["trigger_many_seconds"] = round(triggered, 2)
    out["wait"] = task.wait
    return out


def phase_throughput(s: Scale, out: dict[str, Any]) -> None:
    rate = out["fill_database"]["keys_per_second"]
    wait_db = max(10.0, round(1.5 * TP_KEYS / rate + 3))
    os.environ["BENCH_TP_WAIT_DATABASE"] = str(wait_db)
    s.tasks.tp_database.debounce_wait = wait_db
    results: dict[str, Any] = {"redis": [], "database": [], "bare": {"redis": [], "database": []}}
    # both stores' runs are row transactions in the pool process: CELERY_DB_REUSE_MAX for both
    for store, reuse in (("redis", DB_REUSE_MAX), ("database", DB_REUSE_MAX)):
        w = s.start_worker(f"tp-{store}", 1, reuse)
        time.sleep(3)
        bare_round(s, w, min(TP_KEYS, 1000))  # warm-up, not counted
        results["bare"][store].append(bare_round(s, w, TP_KEYS))
        for i in range(REPEATS):
            log(f"throughput {store}: round {i + 1} of {REPEATS}")
            results[store].append(debounced_round(s, w, store, TP_KEYS))
            results["bare"][store].append(bare_round(s, w, TP_KEYS))
        s.stop_worker(w)
    log("throughput database without CELERY_DB_REUSE_MAX: one round")
    w = s.start_worker("tp-no-reuse", 1)
    time.sleep(3)
    results["database_without_reuse"] = debounced_round(s, w, "database", TP_KEYS)
    warned = "CELERY_DB_REUSE_MAX is not set" in w.log.read_text(errors="replace")
    results["database_without_reuse"]["worker_warned"] = warned
    s.stop_worker(w)
    for store in ("redis", "database"):
        bares = results["bare"][store]
        for i, r in enumerate(results[store]):
            around = [bares[i]["runs_per_second"], bares[i + 1]["runs_per_second"]]
            r["bare_runs_per_second"] = round(statistics.mean(around), 1)
            r["ratio"] = round(r["runs_per_second"] / r["bare_runs_per_second"], 3)
    out["throughput"] = results


def phase_backlog(s: Scale, out: dict[str, Any]) -> None:
    from django_debounce import trigger_many

    out["backlog"] = {}
    for store in ("redis", "database"):
        task = s.tasks.BACKLOG[store]
        log(f"backlog {store}: {BACKLOG_KEYS:,} flights, no worker")
        t0 = time.perf_counter()
        trigger_many(task, s.items(BACKLOG_KEYS))
        triggered = time.perf_counter() - t0
        time.sleep(task.wait + 2)
        due_in = task.get_backend().peek([task.name])
        lpush0 = commandstats(s.broker).get("lpush", 0)
        watch = QueueWatch(s.servers["broker"].url)
        watch.start()
        started = time.time()
        w = s.start_worker(f"backlog-{store}", 1, DB_REUSE_MAX)
        w0 = _window(s, w)
        runs = s.log.wait(task.name.split(".")[1], BACKLOG_KEYS)
        queue = watch.stop()
        time.sleep(2)
        r = _close(s, w, w0, runs)
        r["queue"] = queue
        lpush = commandstats(s.broker).get("lpush", 0) - lpush0
        starts = sorted(at for _k, at in runs)
        r.update(
            {
                "flights": BACKLOG_KEYS,
                "trigger_many_seconds": round(triggered, 2),
                "first_due_in_seconds_at_worker_start": _r(due_in, 2),
                "messages_published": lpush,
                "messages_per_flight": round(lpush / BACKLOG_KEYS, 4),
                "worker_start_to_first_run_seconds": round(starts[0] - started, 2),
            }
        )
        extra = s.log.take(task.name.split(".")[1])
        r["runs_after_the_last"] = len(extra)
        s.stop_worker(w)
        out["backlog"][store] = r


def _set_wait(task: Any, wait: float) -> None:
    """Give ``task`` another ``wait`` in this process (before its first trigger)."""
    task.debounce_wait = wait
    task.__dict__.pop("_flight_options_cache", None)


def _wait_runs(s: Scale, tag: str, n: int, timeout: float) -> list[tuple[str, float]]:
    """Wait until ``n`` runs of ``tag`` were noted or ``timeout`` passed; the runs noted."""
    deadline = time.monotonic() + timeout
    while s.log.count(tag) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    return s.log.take(tag)


def phase_restart(s: Scale, out: dict[str, Any]) -> None:
    """Figure 6: ``RESTART_KEYS`` flights pending on the Redis store, a tenth of them with a
    merged trigger in their counter; the store's Redis killed and started again empty before
    the first comes due, a worker running throughout. Every flight must run once, within its
    wait plus 1.2x the time the store takes to drain that many runs at the backlog's rate."""
    from django_debounce import trigger_many

    task = s.tasks.restart_redis
    n = RESTART_KEYS
    rate = out["backlog"]["redis"]["runs_per_second"]
    fill_rate = min(out["fill_redis"]["keys_per_second"], out["alone"]["redis"]["keys_per_second"])
    merged = max(n // 10, 1)
    wait = float(round(1.5 * (n + merged) / fill_rate + 10))
    os.environ["BENCH_RESTART_WAIT"] = str(wait)
    _set_wait(task, wait)
    w = s.start_worker("restart", 1, DB_REUSE_MAX)
    time.sleep(3)
    items = list(s.items(n))
    last: dict[str, float] = {}
    log(f"restart: {n:,} flights (wait {wait:.0f}s), {merged:,} of them triggered twice")
    t0 = time.time()
    for chunk_items in (items, items[:merged]):
        for i in range(0, len(chunk_items), 1000):
            chunk = chunk_items[i : i + 1000]
            at = time.time()  # no trigger of the chunk is earlier
            trigger_many(task, chunk)
            for item in chunk:
                last[str(item)] = at
    filled = time.time()
    counters = int(s.store.dbsize())
    backend = task.get_backend()
    hashes = s.key_hashes(task, [(i,) for i in items[:merged][:2000]])
    counted = sum(backend.counted(hashes).values())
    restarted = s.restart_store()
    before_due = t0 + wait - restarted
    log(f"restart: Redis restarted empty {before_due:.1f}s before the first flight's due time")
    watch = QueueWatch(s.servers["broker"].url)
    watch.start()
    bound = 1.2 * n / rate
    runs = _wait_runs(s, "restart_redis", n, wait + bound + 120)
    queue = watch.stop()
    time.sleep(5)
    runs += s.log.take("restart_redis")
    s.stop_worker(w)
    first: dict[str, float] = {}
    for key, at in runs:
        first[key] = min(at, first.get(key, at))
    late = sorted(first[k] - (last[k] + wait) for k in first if k in last)
    starts = sorted(at for _k, at in runs)
    out["restart"] = {
        "flights": n,
        "wait_s": wait,
        "triggered_twice": merged,
        "fill_seconds": round(filled - t0, 2),
        "counters_in_redis_before_restart": counters,
        "merged_triggers_counted_in_a_sample_before_restart": counted,
        "restarted_before_first_due_s": round(before_due, 2),
        "drain_rate_runs_per_second": rate,
        "bound_s": round(bound, 2),
        "runs": len(runs),
        "distinct_keys_run": len(first),
        "ran_twice": len(runs) - len(first),
        "never_ran": n - len(first),
        "lateness_after_wait_p50_s": _r(_pct(late, 0.5), 3),
        "lateness_after_wait_p99_s": _r(_pct(late, 0.99), 3),
        "lateness_after_wait_max_s": _r(max(late), 3) if late else None,
        "first_run_after_restart_s": round(starts[0] - restarted, 2) if starts else None,
        "last_run_after_restart_s": round(starts[-1] - restarted, 2) if starts else None,
        "drain_runs_per_second": round(len(runs) / (starts[-1] - starts[0]), 1)
        if len(starts) > 1
        else None,
        "queue": queue,
    }
    log(f"restart: {out['restart']}")


def phase_cluster(s: Scale, out: dict[str, Any]) -> None:
    """Figure 7: an idle worker with the Redis store on a 3-master Redis Cluster (the broker
    stays on its own server), ``CLUSTER_KEYS`` pending keys with their counters on the
    cluster: commands per node (``INFO commandstats`` of each) per pump tick."""
    import subprocess

    import redis

    cluster = RedisCluster(s.tmp)
    s.cluster = cluster
    cluster.start()
    if s.server_cpus is not None:
        for pid in cluster.pids():
            pin_tree(pid, s.server_cpus)
    extra = {"BENCH_REDIS_CLUSTER": ",".join(cluster.startup_nodes)}
    items = s.items(CLUSTER_KEYS)
    log(f"cluster: {CLUSTER_KEYS:,} pending keys with counters on the cluster")
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
    subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--fill-cluster"]
        + [str(items.start), str(CLUSTER_KEYS)],
        env=env,
        check=True,
        timeout=RUN_TIMEOUT,
    )
    nodes = {f"127.0.0.1:{p}": redis.Redis(host="127.0.0.1", port=p) for p in cluster.ports}
    counters = {name: int(c.dbsize()) for name, c in nodes.items()}
    w = s.start_worker("cluster", 2, extra=extra)
    time.sleep(5)
    c0, p0, t0 = {n: commandstats(c) for n, c in nodes.items()}, s.pgmon.snapshot(), time.time()
    time.sleep(IDLE_SECONDS)
    c1, p1, t1 = {n: commandstats(c) for n, c in nodes.items()}, s.pgmon.snapshot(), time.time()
    s.stop_worker(w)
    from django_debounce import conf

    interval = float(conf.get("PUMP_INTERVAL"))
    # the pump sleeps the interval less up to 10% jitter: at most this many ticks
    ticks = (t1 - t0) / (interval * 0.9)
    per_node = {}
    for name in nodes:
        calls = diff(c1[name], c0[name])
        per_node[name] = {
            "counters": counters[name],
            "commands": sum(calls.values()),
            "by_command": calls,
            "commands_per_tick": round(sum(calls.values()) / ticks, 3),
        }
    pg = Postgres.delta(p1, p0)
    out["cluster"] = {
        "nodes": per_node,
        "seconds": round(t1 - t0, 1),
        "ticks_at_most": round(ticks, 1),
        "max_commands_per_tick_per_node": max(v["commands_per_tick"] for v in per_node.values()),
        "sql_statements_per_second": round(pg["statements"] / (t1 - t0), 2),
        "sql_top": pg["top"][:4],
    }
    for c in nodes.values():
        c.close()
    cluster.stop()
    log(f"cluster: {out['cluster']['max_commands_per_tick_per_node']} commands per tick per node")


def fill_cluster(start: int, n: int) -> None:
    """``--fill-cluster START N``: pending keys of ``scale.pending_redis`` made in a process of
    their own with the store on the cluster (``BENCH_REDIS_CLUSTER``)."""
    import django

    django.setup()
    from bench.scale_tasks import pending_redis
    from django_debounce import trigger_many

    for i in range(start, start + n, CHUNK):
        trigger_many(pending_redis, range(i, min(i + CHUNK, start + n)))


def phase_idle_tasks(s: Scale, out: dict[str, Any]) -> None:
    """Figure 3 by task count: an idle worker that registers 1 debounced task, then one that
    registers 50 (``bench.idle_tasks``, each with ``IDLE_TASK_KEYS`` pending keys on the Redis
    store): Redis commands and SQL statements per second."""
    import bench.idle_tasks as idle_tasks
    from django_debounce import trigger_many

    for task in idle_tasks.make(max(IDLE_TASK_COUNTS)):
        trigger_many(task, range(IDLE_TASK_KEYS))
    out["idle_by_tasks"] = {}
    for n in IDLE_TASK_COUNTS:
        log(f"idle: 1 worker with {n} registered debounced tasks, {IDLE_SECONDS:.0f}s")
        w = s.start_worker(f"idle-tasks-{n}", 2, extra={"BENCH_IDLE_TASKS": str(n)})
        out["idle_by_tasks"][str(n)] = idle(s, [w], IDLE_SECONDS)
        s.stop_worker(w)


# -- profiles ---------------------------------------------------------------------------------


def _where(path: str) -> str:
    for marker in ("site-packages/", str(ROOT) + "/", "lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def profiled(fn: Any, *args: Any, top: int = 14) -> dict[str, Any]:
    """Run ``fn(*args)`` under cProfile (which slows Python code down about twofold: read
    the shares, not the times): the functions with most time of their own, and this app's
    functions by time including their callees."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    fn(*args)
    prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = [
        (tt, ct, nc, f"{_where(file)}:{line}({func})")
        for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.items()
    ]
    own = sorted(rows, reverse=True)[:top]
    app = sorted((r for r in rows if "django_debounce/" in r[3]), key=lambda r: r[1], reverse=True)[
        :top
    ]
    cumulative = sorted(
        (r for r in rows if "cProfile" not in r[3] and "scale.py" not in r[3]),
        key=lambda r: r[1],
        reverse=True,
    )[: top * 2]
    return {
        "wall_ms_profiled": round(wall * 1e3, 1),
        "cumulative": [
            {"ms": round(ct * 1e3, 1), "share": round(ct / wall, 3), "calls": nc, "function": f}
            for _tt, ct, nc, f in cumulative
        ],
        "own_time": [
            {"ms": round(tt * 1e3, 1), "share": round(tt / wall, 3), "calls": nc, "function": f}
            for tt, _ct, nc, f in own
        ],
        "app_cumulative": [
            {"ms": round(ct * 1e3, 1), "share": round(ct / wall, 3), "calls": nc, "function": f}
            for _tt, ct, nc, f in app
        ],
    }


def _fire_all(task: Any, hashes: list[str]) -> None:
    for hashed in hashes:
        task.fire(hashed, None, in_worker=False)


def phase_profiles(s: Scale, out: dict[str, Any]) -> None:
    """Where the time goes, in this process (no worker running): a fill chunk of each store,
    and a run's store work (claim, body, finish: ``task.fire`` in-process, as a pool process
    does for a message) for 300 due keys of each store."""
    from django_debounce import trigger_many

    t = s.tasks
    prof: dict[str, Any] = {}
    prof["trigger_many_redis_10000_new_keys"] = profiled(
        trigger_many, t.pending_redis, list(s.items(10_000))
    )
    prof["trigger_many_database_1000_new_keys"] = profiled(
        trigger_many, t.pending_database, list(s.items(1000))
    )
    for store, task in t.THROUGHPUT.items():
        items = list(s.items(600))
        trigger_many(task, items)
        time.sleep(task.flight_options().wait + 1.5)
        hashes = s.key_hashes(task, [(i,) for i in items])
        t0 = time.perf_counter()
        _fire_all(task, hashes[:300])
        prof[f"run_{store}_300_unprofiled_us_per_run"] = round(
            (time.perf_counter() - t0) / 300 * 1e6, 1
        )
        prof[f"run_{store}_300"] = profiled(_fire_all, task, hashes[300:])
    out["profiles"] = prof


# -- figures ----------------------------------------------------------------------------------


def figures(out: dict[str, Any]) -> list[dict[str, Any]]:
    from bench.scale_report import figure
    from django_debounce import conf

    cap, batch = int(conf.get("PUMP_QUEUE_CAP")), int(conf.get("PUMP_BATCH"))
    f: list[dict[str, Any]] = []
    fr, fd, floor_r, floor_pg = (
        out["fill_redis"],
        out["fill_database"],
        out["redis_floor"],
        out["pg_floor"],
    )
    # fill rates: the targets of the previous design (not in issue 22's list), kept to show
    # what a new key costs now that it is a row transaction on both stores
    f.append(
        figure(
            "1. fill rate, Redis store (trigger_many: rows, then counters)",
            fr["keys_per_second"],
            "keys/s",
            floor_pg["one_row_per_transaction_per_second"],
            ">=",
            5000,
            "one INSERT of a key row per autocommit transaction; raw redis-py pipelines of "
            f"the same counters: {floor_r['keys_per_second']:,.0f} keys/s",
            "target of the previous design",
        )
    )
    f.append(
        figure(
            "1. fill rate, database store (trigger_many)",
            fd["keys_per_second"],
            "keys/s",
            floor_pg["one_row_per_transaction_per_second"],
            ">=",
            2000,
            "one INSERT of a key row per autocommit transaction (the commit waits for "
            f"the WAL flush); 1,000 rows per statement: "
            f"{floor_pg['rows_per_second_1000_per_statement']:,.0f} rows/s",
            "target of the previous design",
        )
    )
    for store, target in (("redis", 5000), ("database", 2000)):
        a = out["alone"][store]
        f.append(
            figure(
                f"1. trigger_many alone, {ALONE_KEYS:,} new keys, {store} store",
                a["keys_per_second"],
                "keys/s",
                floor_pg["one_row_per_transaction_per_second"],
                ">=",
                target,
                "as for the fill rate",
                "target of the previous design",
            )
        )
    sr, srv, srs = out["sizes_redis"], out["sizes_receiver"], out["sizes_receiver_saved"]
    f.append(
        figure(
            "1. Redis bytes per pending debounced_task key (its counter, MEMORY USAGE of "
            f"{sr['counters_sampled']:,} sampled)",
            sr["counter_bytes_mean"],
            "bytes",
            floor_r["bytes_per_key"],
            "<=",
            300,
            "INFO memory delta per key of raw hashes of the same fields with an expiry "
            "(redis-py, no app)",
        )
    )
    f.append(
        figure(
            "1. Redis bytes per pending debounced_task key, INFO used_memory delta / keys",
            fr["bytes_per_key"],
            "bytes",
            floor_r["bytes_per_key"],
            "<=",
            300,
            "as above",
        )
    )
    f.append(
        figure(
            "1. Redis bytes per pending post_save receiver key made by a save (its counter)",
            srs["counter_bytes_mean"],
            "bytes",
            floor_r["bytes_per_key"],
            "<=",
            300,
            "as above",
        )
    )
    f.append(
        figure(
            "1. ... the same receiver's key made by trigger_many (its counter)",
            srv["counter_bytes_mean"],
            "bytes",
            floor_r["bytes_per_key"],
            "<=",
            300,
            "as above",
        )
    )
    f.append(
        figure(
            "1. ... receiver keys, INFO used_memory delta / keys (trigger_many)",
            out["fill_receiver"]["bytes_per_key"],
            "bytes",
            floor_r["bytes_per_key"],
            "<=",
            300,
            "as above",
        )
    )
    f.append(
        figure(
            "1. PostgreSQL bytes per Redis-store key (pg_total_relation_size delta / rows)",
            fr["pg_bytes_per_row"],
            "bytes",
            out["pg_row_data_bytes"]["redis"],
            None,
            None,
            "pg_column_size of the row (its data alone, no index or page overhead)",
        )
    )
    f.append(
        figure(
            "1. PostgreSQL bytes per database-store key (key row + due index row)",
            round(fd["pg_bytes_per_row_key"] + fd["pg_bytes_per_row_due"], 1),
            "bytes",
            out["pg_row_data_bytes"]["database"],
            None,
            None,
            "pg_column_size of the key row",
        )
    )
    before, after = out["worker_memory_before"], out["worker_memory_after"]
    grown = (after["tree_rss_kib"] - before["tree_rss_kib"]) / 1024
    f.append(
        figure(
            "1. worker RSS growth over the fill (main process + 2 pool processes)",
            round(grown, 1),
            "MiB",
            round(before["tree_rss_kib"] / 1024, 1),
            "<",
            50,
            "the worker's RSS before the fill",
        )
    )
    pending = sum(out["outstanding"].get(name, 0) for name in out["pending_tasks"])
    keys = REDIS_KEYS + RECEIVER_KEYS + DB_KEYS
    f.append(
        figure(
            "1. broker messages outstanding for the pending keys (queue + unacked)",
            pending,
            "messages",
            keys,
            "<=",
            0,
            "pending keys: one message each if every flight waited in the broker",
        )
    )
    base = out["publish_to_start"]["p50_s"]
    for p in out["probe"].values():
        wait = p["wait"]
        f.append(
            figure(
                f"2. probe wait={wait}, {p['store']} store, trigger-to-start p50 ({p['path']})",
                p["p50_s"],
                "s",
                round(wait + base, 4),
                "<",
                round(wait + 1.0 + 0.1, 3),
                "wait + bare publish-to-start p50 in the same worker; target: wait + "
                "pump tick (DEBOUNCE_PUMP_INTERVAL 1 s) + 0.1 s",
            )
        )
        f.append(
            figure(
                f"2. probe wait={wait}, {p['store']} store, trigger-to-start p99",
                p["p99_s"],
                "s",
                round(wait + out["publish_to_start"]["p99_s"], 4),
                "<",
                wait + 1.0,
                "wait + bare publish-to-start p99",
            )
        )
    p1k, pfull = out["pump_1k"], out["pump_full"]
    f.append(
        figure(
            "3. pump tick (Pump().tick(), nothing due), full scale, median",
            pfull["median_ms"],
            "ms",
            p1k["median_ms"],
            "<",
            50,
            "the same tick at 1,000 keys",
        )
    )
    f.append(
        figure(
            "3. ... Redis commands per idle pump tick, full scale",
            pfull["redis_commands_per_tick"],
            "commands",
            p1k["redis_commands_per_tick"],
            "<=",
            0,
            "at 1,000 keys",
        )
    )
    f.append(
        figure(
            "3. ... SQL statements per idle pump tick, full scale",
            pfull["sql_statements_per_tick"],
            "statements",
            p1k["sql_statements_per_tick"],
            None,
            None,
            "at 1,000 keys",
        )
    )
    for key, label in (("idle_1", "1 worker"), ("idle_3", "3 workers")):
        f.append(
            figure(
                f"3. Redis commands per second per idle worker, {label}, full scale",
                out[key]["redis_commands_per_worker_per_second"],
                "commands/s",
                out["idle_1k"]["redis_commands_per_worker_per_second"],
                "<=",
                20,
                "1 idle worker at 1,000 keys",
                "target of the previous design",
            )
        )
        f.append(
            figure(
                f"3. SQL statements per second per idle worker, {label}",
                out[key]["sql_statements_per_worker_per_second"],
                "statements/s",
                out["idle_1k"]["sql_statements_per_worker_per_second"],
                None,
                None,
                "1 idle worker at 1,000 keys",
            )
        )
        f.append(
            figure(
                f"3. new PostgreSQL sessions per second per idle worker, {label}",
                out[key]["pg_sessions_per_worker_per_second"],
                "sessions/s",
                out["idle_1k"]["pg_sessions_per_worker_per_second"],
                None,
                None,
                "1 idle worker at 1,000 keys",
            )
        )
    by = out["idle_by_tasks"]
    lo, hi = (str(n) for n in IDLE_TASK_COUNTS)
    for what, field, unit in (
        ("Redis commands", "redis_commands_per_worker_per_second", "commands/s"),
        ("SQL statements", "sql_statements_per_worker_per_second", "statements/s"),
    ):
        a, b = by[lo][field], by[hi][field]
        f.append(
            figure(
                f"3. {what} per second of an idle worker with {hi} registered debounced "
                f"tasks ({IDLE_TASK_KEYS} pending keys each)",
                b,
                unit,
                a,
                "<=",
                round(a * 1.1 + 0.1, 2),
                f"the same with {lo} registered task",
                "target: no growth (the baseline + 10% + 0.1 for noise)",
            )
        )
    tp = out["throughput"]
    for store, target in (("redis", 0.25), ("database", 0.25)):
        rounds = tp[store]
        ratio = statistics.median(r["ratio"] for r in rounds)
        f.append(
            figure(
                f"4. throughput, {store} store, debounced / bare runs/s (median of {len(rounds)})",
                round(ratio, 3),
                "x",
                1.0,
                ">=",
                target,
                "bare",
            )
        )
        f.append(
            figure(
                f"4. ... debounced runs/s, {store} store (median)",
                round(statistics.median(r["runs_per_second"] for r in rounds), 1),
                "runs/s",
                round(statistics.median(b["runs_per_second"] for b in tp["bare"][store]), 1),
                None,
                None,
                "bare Celery task, same worker (median)",
            )
        )
        med = lambda k, rr=rounds: round(statistics.median(r[k] for r in rr), 3)  # noqa: E731
        bare_med = lambda k, st=store: round(  # noqa: E731
            statistics.median(b[k] for b in tp["bare"][st]), 3
        )
        f.append(
            figure(
                f"4. ... Redis client commands per run, {store} store",
                round(
                    statistics.median(r["store_client_commands_per_run"]["total"] for r in rounds),
                    3,
                ),
                "commands",
                bare_med("broker_commands_per_run"),
                None,
                None,
                "broker commands per bare run (the transport's own cost)",
            )
        )
        f.append(
            figure(
                f"4. ... SQL statements per run, {store} store (pg_stat_statements)",
                med("sql_statements_per_run"),
                "statements",
                bare_med("sql_statements_per_run"),
                None,
                None,
                "bare run",
            )
        )
        f.append(
            figure(
                f"4. ... new PostgreSQL sessions per run (pg_stat_database), {store} store",
                med("pg_sessions_per_run"),
                "sessions",
                bare_med("pg_sessions_per_run"),
                None,
                None,
                "bare run",
            )
        )
    nr = tp["database_without_reuse"]
    f.append(
        figure(
            "4. ... new PostgreSQL sessions per run, database store without CELERY_DB_REUSE_MAX",
            nr["pg_sessions_per_run"],
            "sessions",
            statistics.median(r["pg_sessions_per_run"] for r in tp["database"]),
            None,
            None,
            "with CELERY_DB_REUSE_MAX=1000",
        )
    )
    for store, target in (("redis", 0.25), ("database", 0.25)):
        b = out["backlog"][store]
        f.append(
            figure(
                f"5. backlog, {store} store: messages published per flight",
                b["messages_per_flight"],
                "messages",
                1.0,
                "<=",
                1.05,
                "one message per flight",
            )
        )
        bare = statistics.median(x["runs_per_second"] for x in tp["bare"][store])
        f.append(
            figure(
                f"5. backlog, {store} store: drain runs/s / bare runs/s",
                round(b["runs_per_second"] / bare, 3),
                "x",
                1.0,
                ">=",
                target,
                f"bare runs/s of figure 4 ({bare:,.0f}); drain {b['runs_per_second']:,.0f} runs/s",
            )
        )
        f.append(
            figure(
                f"5. backlog, {store} store: broker queue depth, max (sampled every 10 ms)",
                b["queue"]["max_depth"],
                "messages",
                cap,
                "<=",
                cap + batch,
                f"DEBOUNCE_PUMP_QUEUE_CAP; target: the cap + one batch (DEBOUNCE_PUMP_BATCH "
                f"{batch})",
            )
        )
    r = out["restart"]
    f.append(
        figure(
            f"6. Redis restarted empty with {r['flights']:,} pending flights: flights that "
            "never ran + flights that ran twice",
            r["never_ran"] + r["ran_twice"],
            "flights",
            r["flights"],
            "<=",
            0,
            "flights pending at the restart",
        )
    )
    f.append(
        figure(
            "6. ... latest start after a flight's last trigger + wait",
            r["lateness_after_wait_max_s"],
            "s",
            round(r["flights"] / r["drain_rate_runs_per_second"], 2),
            "<=",
            r["bound_s"],
            f"the time to drain {r['flights']:,} runs at the backlog's rate "
            f"({r['drain_rate_runs_per_second']:,.0f} runs/s); target: 1.2x that",
        )
    )
    f.append(
        figure(
            "6. ... broker queue depth during the drain, max",
            r["queue"]["max_depth"],
            "messages",
            cap,
            "<=",
            cap + batch,
            "DEBOUNCE_PUMP_QUEUE_CAP; target: the cap + one batch",
        )
    )
    c = out["cluster"]
    f.append(
        figure(
            "7. Redis Cluster (3 masters): commands per idle pump tick, busiest node",
            c["max_commands_per_tick_per_node"],
            "commands",
            1,
            "<=",
            1,
            "one command per node per tick (the target); with the due index in the "
            "database, none is expected",
        )
    )
    return f  # fmt: skip


def main() -> int:
    from bench.scale_report import write

    load_before = os.getloadavg()
    started = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="debounce-scale-"))
    s = Scale(tmp)

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, stop)
    out: dict[str, Any] = {}
    try:
        s.start()
        log(f"servers up (logs in {tmp}); placement: {s.placement}")
        out["redis_floor"] = redis_floor(s)
        phase_fill(s, out)
        out["pg_floor"] = pg_floor(s)
        phase_idle(s, out)
        phase_idle_tasks(s, out)
        phase_throughput(s, out)
        phase_backlog(s, out)
        phase_restart(s, out)
        phase_cluster(s, out)
        phase_profiles(s, out)
        out["postgresql"] = {
            "version": s.pgmon.scalar("SHOW server_version"),
            **{
                name: s.pgmon.scalar(f"SHOW {name}")
                for name in ("fsync", "synchronous_commit", "shared_buffers", "max_connections")
            },
            "set": s.pg.settings,
        }
    except BenchError as exc:
        print(f"bench scale: ERROR: {exc} (logs in {tmp})", file=sys.stderr)
        return 1
    finally:
        s.close()
    meta = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "scripts/bench scale",
        "seconds": round(time.time() - started),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "placement": s.placement,
        "scale": {
            "redis_keys": REDIS_KEYS,
            "receiver_keys": RECEIVER_KEYS,
            "database_keys": DB_KEYS,
            "probe_ticks": PROBES,
            "idle_seconds": IDLE_SECONDS,
            "throughput_keys": TP_KEYS,
            "repeats": REPEATS,
            "backlog_keys": BACKLOG_KEYS,
            "restart_keys": RESTART_KEYS,
            "cluster_keys": CLUSTER_KEYS,
            "idle_task_counts": list(IDLE_TASK_COUNTS),
        },
    }
    target = Path(os.environ.get("BENCH_SCALE_OUT", ROOT / "bench" / "results"))
    write(target, meta, figures(out), out)
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fill-cluster"]:
        fill_cluster(int(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
