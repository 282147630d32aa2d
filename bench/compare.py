"""This app against the libraries people use today and against the limits, in one run (issue 6).

    scripts/bench compare       (starts throwaway Redis and PostgreSQL, then runs this)

Starts two more Redis servers (the Celery broker's, so its traffic is counted alone, and a
stats server for the run records) and a Celery worker (prefork, 4 processes); drives every
contender with the same saves of the same table; waits until each has drained (queue empty,
nothing held by the worker, no task in flight, nothing pending in this app's stores); and
writes ``bench/results/latest.json``, ``latest.md`` and ``latest.svg``, printing the table.

Scenarios (section 3 of issue 6); every contender gets the same trigger stream:

- a: 200 saves of one row, one every 2 ms; the job takes 30 ms;
- b: a save every 10 ms for 5 s (500 saves); job 30 ms;
- c: a burst (20 saves, every 2 ms), then one more save while a run of the key is live
  (the job takes 200 ms so that the save surely lands inside it): is the last save applied?
- d: 1,000 saves of one row as fast as one process can; job 30 ms;
- e: 10 triggers in a row on each of 10,000 rows (``post_save`` as a save sends it, without
  the ``UPDATE``: 600,000 saves would not fit the time), from 2 processes (one per core);
  the job is empty; a fresh worker per contender, for its peak memory; the worker gets
  ``BENCH_E_DRAIN`` seconds (default 90) to work off what is left, the rest is purged;
- f: 4 OS processes send ``post_save`` for one row as fast as they can for ``BENCH_F_SECONDS``
  (no ``UPDATE``: the trigger path alone, comparable with the 4-process limits); job empty.

This app runs with ``wait=0.05, max_wait=0.5`` everywhere (scenario b's options); the counter
pattern's countdown is the same 0.05 s; celery-once and celery-singleton have no wait.
Environment: ``BENCH_F_SECONDS`` (default 3), ``BENCH_E_KEYS`` (default 10000, for quick
trials only), ``BENCH_ONLY`` (scenario letters, e.g. ``ab``), ``BENCH_CONTENDERS``.
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import platform
import queue
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import BenchError, RedisServer, Worker  # noqa: E402

SCENARIOS = "abcdef"
ORDER = ["per_save", "counter", "once", "singleton", "redis", "database"]
LABELS = {
    "per_save": "task per save (.delay)",
    "counter": "counter pattern (INCR + countdown)",
    "once": "celery-once QueueOnce",
    "singleton": "celery-singleton Singleton",
    "redis": "django-debounce, Redis store",
    "database": "django-debounce, database store (PostgreSQL)",
}
F_SECONDS = float(os.environ.get("BENCH_F_SECONDS", "3"))
E_KEYS = int(os.environ.get("BENCH_E_KEYS", "10000"))
DRAIN_TIMEOUT = float(os.environ.get("BENCH_DRAIN_TIMEOUT", "600"))
# Scenario e: how long the worker may take to work off what the triggers left. A task per save
# and the counter pattern leave 100,000 messages, more than a worker of this machine runs in
# minutes; what is still queued then is counted, purged, and the row says so.
E_DRAIN = float(os.environ.get("BENCH_E_DRAIN", "90"))


class DrainTimeout(BenchError):
    """A contender still had work after the time allowed."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the run --------------------------------------------------------------------------------


class Bench:
    """Servers, worker and clients of one run; ``close()`` stops everything it started."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.broker_server = RedisServer("broker", tmp)
        self.stats_server = RedisServer("stats", tmp)
        self.worker: Worker | None = None

    def start(self) -> None:
        self.broker_server.start()
        self.stats_server.start()
        os.environ["BENCH_BROKER_URL"] = self.broker_server.url
        os.environ["BENCH_STATS_URL"] = self.stats_server.url
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection
        from django_redis import get_redis_connection

        call_command("migrate", verbosity=0)
        connection.ensure_connection()
        import bench.contenders as c

        self.c = c
        self.stats = c.stats()
        self.broker = __import__("redis").Redis.from_url(self.broker_server.url)
        self.store = get_redis_connection("default")
        self.stats.flushall()
        self.broker.flushall()
        self.store.flushall()
        self.start_worker()

    def start_worker(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.stats.delete(self.c.READY)
        self.stats.set(self.c.INFLIGHT, 0)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.worker = Worker(env, self.tmp / "worker.log")
        self.worker.start(lambda: self.stats.get(self.c.READY))

    def close(self) -> None:
        for stop in (
            lambda: self.worker and self.worker.stop(),
            self.broker_server.stop,
            self.stats_server.stop,
        ):
            try:
                stop()
            except Exception as exc:  # keep stopping the rest
                log(f"stop failed: {exc}")

    # -- bookkeeping ------------------------------------------------------------------------

    def published(self) -> dict[str, int]:
        self.c.flush_published()
        return {k.decode(): int(v) for k, v in self.stats.hgetall(self.c.PUBLISHED).items()}

    def lpush_calls(self) -> int:
        stats = self.broker.info("commandstats")
        return int(stats.get("cmdstat_lpush", {}).get("calls", 0))

    def busy(self, contender: str) -> int:
        n = int(self.broker.llen("bench")) + int(self.stats.get(self.c.INFLIGHT) or 0)
        if contender in ("redis", "database"):
            from django_debounce.models import DebounceKey

            task = self.c.CONTENDERS[contender][1]
            n += DebounceKey.objects.filter(task_name=task).exclude(state="idle").count()
        held = int(self.broker.hlen("unacked"))
        if n or not held or held > 1000:
            return n + held
        # Lease watchdogs parked by this app in an earlier scenario are held by the worker
        # for DEBOUNCE_LEASE: they are not work left for anyone.
        return sum(1 for m in self.broker.hvals("unacked") if not _is_watchdog(m))

    def drain(self, contender: str, timeout: float = DRAIN_TIMEOUT) -> float:
        """Wait until the contender has nothing left to do; returns when that was seen first."""
        deadline = time.monotonic() + timeout
        quiet, first_quiet = 0, None
        while quiet < 3:
            if time.monotonic() > deadline:
                raise DrainTimeout(f"{contender} did not drain within {timeout:.0f}s")
            if self.busy(contender):
                quiet, first_quiet = 0, None
            else:
                quiet += 1
                first_quiet = first_quiet or time.time()
            time.sleep(0.1)
        return first_quiet or time.time()

    def purge(self, contender: str) -> int:
        """Stop the worker, drop every message left (queued or held) and the contender's
        state, start a fresh worker; returns how many messages were dropped."""
        assert self.worker is not None
        self.worker.stop()  # a warm shutdown puts held messages back on the queue
        left = int(self.broker.llen("bench")) + int(self.broker.hlen("unacked"))
        self.broker.delete("bench", "unacked", "unacked_index")
        # Flights whose messages were dropped must not be recovered later, in another
        # contender's turn (a worker start runs this app's recovery).
        from django_debounce.models import DebounceKey

        DebounceKey.objects.filter(task_name=self.c.CONTENDERS[contender][1]).delete()
        self.store.flushall()
        self.start_worker()
        return left

    def take_runs(self) -> list[list[Any]]:
        pipe = self.stats.pipeline()
        pipe.lrange(self.c.RUNS, 0, -1)
        pipe.delete(self.c.RUNS)
        raw, _ = pipe.execute()
        return [json.loads(r) for r in raw]

    def docs(self, contender: str, scenario: str, n: int, job_ms: int) -> list[int]:
        from bench.models import BenchDoc

        rows = BenchDoc.objects.bulk_create(
            [BenchDoc(contender=contender, scenario=scenario, job_ms=job_ms) for _ in range(n)],
            batch_size=2000,
        )
        return [r.pk for r in rows]


def _is_watchdog(raw: bytes) -> bool:
    """A lease watchdog of this app (held by the worker until the lease of a run that had a
    trigger during it would end, ``DEBOUNCE_LEASE``, 300 s by default; it does nothing when
    the run has finished): not work left to do, so draining does not wait for it."""
    try:
        message = json.loads(raw)[0]
        body = json.loads(base64.b64decode(message["body"]))
        return "w" in body[1].get("__debounce__", {})
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return False


# -- triggering -----------------------------------------------------------------------------


class Stream:
    """Saves rows of one contender's proxy and notes when each trigger was made."""

    def __init__(self, model: Any) -> None:
        from django.db.models.signals import post_save

        self.post_save = post_save
        self.model = model
        self.times: dict[int, list[float]] = {}
        self.final: dict[int, int] = {}
        self.busy = 0.0

    def save(self, pk: int, version: int) -> float:
        before = time.time()
        t0 = time.perf_counter()
        self.model(pk=pk, version=version).save(update_fields=["version"])
        self.busy += time.perf_counter() - t0
        self.times.setdefault(pk, []).append(before)
        self.final[pk] = version
        return before

    def signal(self, pk: int) -> float:
        """A trigger without the ``UPDATE``: ``post_save`` as a save sends it (scenario e)."""
        before = time.time()
        self.post_save.send(
            sender=self.model,
            instance=self.model(pk=pk, version=0),
            created=False,
            update_fields=frozenset(["version"]),
            raw=False,
            using="default",
        )
        self.times.setdefault(pk, []).append(before)
        self.final[pk] = 0
        return before

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.times.values())


def paced(n: int, interval: float, fn) -> float:
    """Call ``fn(i)`` for i < n, the i-th at ``i * interval`` from the start; returns the span."""
    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        fn(i)
    return time.perf_counter() - t0


def _f_child(mode: str, contender: str, pk: int, seconds: float, barrier: Any, out: Any) -> None:
    """One of the 4 trigger processes of scenario f (and of the 4-process limits)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    import bench.contenders as c

    count, errors, last, warm = 0, [], 0.0, 0
    if mode == "trigger":
        from django.db.models.signals import post_save

        model = c.CONTENDERS[contender][0]
        instance = model.objects.get(pk=pk)

        def op() -> None:
            post_save.send(
                sender=model,
                instance=instance,
                created=False,
                update_fields=None,
                raw=False,
                using="default",
            )
    elif mode == "incr":
        from django_redis import get_redis_connection

        client = get_redis_connection("default")

        def op() -> None:
            client.incr("bench:limit:incr")
    elif mode == "update":
        from django.db import connection

        cursor = connection.cursor()

        def op() -> None:
            cursor.execute("UPDATE bench_benchdoc SET version = version + 1 WHERE id = %s", [pk])
    else:

        def op() -> None:
            c.noop.apply_async(queue="bench-limit")

    op()  # connections open before the clock starts (a trigger too: counted, not timed)
    warm = 1
    barrier.wait(timeout=120)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        last = time.time()
        try:
            op()
        except Exception as exc:  # reported, and the scenario is marked
            errors.append(f"{type(exc).__name__}: {exc}")
        count += 1
    c.flush_published()
    out.put((count, last, errors[:5], len(errors), warm))


def four_processes(mode: str, contender: str, pk: int, seconds: float) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [
        ctx.Process(target=_f_child, args=(mode, contender, pk, seconds, barrier, out))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=seconds + 180) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    total = sum(r[0] for r in results)
    return {
        "triggers": total + sum(r[4] for r in results),
        "per_second": round(total / seconds),
        "last_trigger": max(r[1] for r in results),
        "errors": sum(r[3] for r in results),
        "error_samples": [e for r in results for e in r[2]][:5],
    }


# -- limits ---------------------------------------------------------------------------------


def _median_us(fn, n: int, rounds: int = 5) -> float:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    return round(statistics.median(samples) * 1e6, 1)


def limits(b: Bench) -> dict[str, Any]:
    from django.db import connection

    from bench.models import NoopDoc

    [pk] = b.docs("limit", "-", 1, 0)
    cursor = connection.cursor()
    out: dict[str, Any] = {}
    for _ in range(2):  # the second pass is the measurement (warm connections and caches)
        out["redis_incr_us"] = _median_us(lambda: b.store.incr("bench:limit:incr"), 2000)
        out["pg_update_us"] = _median_us(
            lambda: cursor.execute(
                "UPDATE bench_benchdoc SET version = version + 1 WHERE id = %s", [pk]
            ),
            1000,
        )
        out["celery_publish_us"] = _median_us(
            lambda: b.c.noop.apply_async(queue="bench-limit"), 500
        )
        out["bare_save_us"] = _median_us(
            lambda: NoopDoc(pk=pk, version=1).save(update_fields=["version"]), 1000
        )
    # Publish-to-start latency of a bare task through the same broker and worker.
    latencies = []
    for _ in range(40):
        sent = time.time()
        b.c.per_save_job.delay(-1)  # no such row: the task returns at once
        while int(b.stats.get(b.c.INFLIGHT) or 0) == 0 and time.time() - sent < 5:
            pass
        latencies.append(time.time() - sent)
        b.drain("per_save")
    out["publish_to_start_ms"] = round(statistics.median(latencies) * 1e3, 2)
    # Memory of one plain counter key (the least per-key state a Redis debouncer can keep).
    before = b.store.info("memory")["used_memory"]
    pipe = b.store.pipeline(transaction=False)
    for i in range(10_000):
        pipe.incr(f"bench:limit:key:{i}")
    pipe.execute()
    out["redis_bytes_per_counter_key"] = round(
        (b.store.info("memory")["used_memory"] - before) / 10_000, 1
    )
    b.store.delete(*[f"bench:limit:key:{i}" for i in range(10_000)])
    for mode in ("incr", "update", "publish"):
        r = four_processes(mode, "", pk, F_SECONDS)
        out[f"four_process_{mode}_per_second"] = r["per_second"]
    b.broker.delete("bench-limit")
    return out


# -- scenarios ------------------------------------------------------------------------------


def scenario_a(b: Bench, contender: str, model: Any) -> dict[str, Any]:
    [pk] = b.docs(contender, "a", 1, 30)
    s = Stream(model)
    span = paced(200, 0.002, lambda i: s.save(pk, i + 1))
    return {"stream": s, "stream_seconds": round(span, 3)}


def scenario_b(b: Bench, contender: str, model: Any) -> dict[str, Any]:
    [pk] = b.docs(contender, "b", 1, 30)
    s = Stream(model)
    span = paced(500, 0.010, lambda i: s.save(pk, i + 1))
    return {"stream": s, "stream_seconds": round(span, 3)}


def scenario_c(b: Bench, contender: str, model: Any) -> dict[str, Any]:
    [pk] = b.docs(contender, "c", 1, 200)
    pubsub = b.stats.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(b.c.STARTED)
    while pubsub.get_message(timeout=1.0) is None and not pubsub.subscribed:
        pass
    s = Stream(model)
    live = 0

    def events(timeout: float) -> None:
        nonlocal live
        msg = pubsub.get_message(timeout=timeout)
        while msg is not None:
            name, key, edge = msg["data"].decode().split(":")
            if name == contender and int(key) == pk:
                live += 1 if edge == "+" else -1
            msg = pubsub.get_message(timeout=0)

    paced(20, 0.002, lambda i: s.save(pk, i + 1))
    deadline = time.monotonic() + 30
    events(0)
    while live <= 0 and time.monotonic() < deadline:
        events(0.005)
    extra = s.save(pk, 21) if live > 0 else None
    pubsub.close()
    return {"stream": s, "extra_save_at": extra}


def scenario_d(b: Bench, contender: str, model: Any) -> dict[str, Any]:
    [pk] = b.docs(contender, "d", 1, 30)
    s = Stream(model)
    span = paced(1000, 0.0, lambda i: s.save(pk, i + 1))
    return {
        "stream": s,
        "stream_seconds": round(span, 3),
        "us_per_save": round(s.busy / 1000 * 1e6, 1),
    }


def _memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def _sampled_usage(client: Any, dbs: list[int], n: int = 200) -> float | None:
    """Mean ``MEMORY USAGE`` of up to ``n`` keys of the store Redis (the contender's state)."""
    sizes = []
    for db in dbs:
        conn = client.connection_pool.connection_kwargs
        one = __import__("redis").Redis(host=conn["host"], port=conn["port"], db=db)
        for key in one.scan_iter(count=500):
            sizes.append(one.memory_usage(key) or 0)
            if len(sizes) >= n:
                break
        one.close()
    return round(statistics.mean(sizes), 1) if sizes else None


def _keyspace(client: Any) -> dict[int, int]:
    return {int(k[2:]): int(v["keys"]) for k, v in client.info("keyspace").items()}


def _e_child(contender: str, pks: list[int], barrier: Any, out: Any) -> None:
    """One of the 2 trigger processes of scenario e: 10 triggers in a row per key."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    import bench.contenders as c

    s = Stream(c.CONTENDERS[contender][0])
    barrier.wait(timeout=120)
    for pk in pks:
        for _ in range(10):
            s.signal(pk)
    c.flush_published()
    out.put(s.times)


def scenario_e(b: Bench, contender: str, model: Any) -> dict[str, Any]:
    b.start_worker()  # a fresh worker: its peak memory is this contender's
    pks = b.docs(contender, "e", E_KEYS, 0)
    b.store.flushall()
    store0, broker0 = _memory(b.store), _memory(b.broker)
    broker_peak = store_peak = 0
    s = Stream(model)
    # Two trigger processes (one per core), each taking every other key.
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [
        ctx.Process(target=_e_child, args=(contender, pks[i::2], barrier, out)) for i in (0, 1)
    ]
    for p in procs:
        p.start()
    barrier.wait(timeout=120)
    t0 = time.perf_counter()
    parts: list[dict[int, list[float]]] = []
    try:
        while len(parts) < 2:
            try:
                parts.append(out.get(timeout=0.5))
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and out.empty():
                    raise BenchError("a trigger process of scenario e died") from None
            store_peak = max(store_peak, _memory(b.store) - store0)
            broker_peak = max(broker_peak, _memory(b.broker) - broker0)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    span = time.perf_counter() - t0
    for part in parts:
        s.times.update(part)
    s.final = dict.fromkeys(s.times, 0)
    store_delta = _memory(b.store) - store0
    broker_peak = max(broker_peak, _memory(b.broker) - broker0)
    keyspace = _keyspace(b.store)
    return {
        "stream": s,
        "stream_seconds": round(span, 3),
        "keys": len(pks),
        "store_redis_keys": sum(keyspace.values()),
        "store_redis_bytes": store_delta,
        "store_redis_peak_bytes": max(store_peak, store_delta),
        "store_redis_memory_usage_sampled": _sampled_usage(b.store, sorted(keyspace)),
        "broker_redis_peak_bytes": broker_peak,
    }


def scenario_f(b: Bench, contender: str, model: Any) -> dict[str, Any]:
    [pk] = b.docs(contender, "f", 1, 0)
    r = four_processes("trigger", contender, pk, F_SECONDS)
    s = Stream(model)
    s.times[pk] = [r.pop("last_trigger")]
    s.final[pk] = 0
    return {"stream": s, "f": r, "triggers_made": r["triggers"]}


RUNNERS = {
    "a": scenario_a,
    "b": scenario_b,
    "c": scenario_c,
    "d": scenario_d,
    "e": scenario_e,
    "f": scenario_f,
}


def run_one(b: Bench, scenario: str, contender: str) -> dict[str, Any]:
    from bench.report import analyse

    model, task = b.c.CONTENDERS[contender]
    published0, lpush0 = b.published(), b.lpush_calls()
    started = time.time()
    info = RUNNERS[scenario](b, contender, model)
    try:
        last = b.drain(contender, E_DRAIN if scenario == "e" else DRAIN_TIMEOUT)
    except DrainTimeout:
        if scenario != "e":
            raise
        last = time.time()
        info["worker_memory"] = b.worker.memory() if b.worker else {}
        info["drain_cut"] = {"after_seconds": E_DRAIN, "messages_purged": b.purge(contender)}
        log(f"scenario e: {contender}: cut after {E_DRAIN:.0f}s: {info['drain_cut']}")
    runs = [r for r in b.take_runs() if r[0] == contender]
    published = b.published()
    info["published"] = published.get(task, 0) - published0.get(task, 0)
    info["broker_lpush"] = b.lpush_calls() - lpush0
    info["drained_seconds"] = round(last - started, 2)
    if scenario == "e" and "worker_memory" not in info:
        assert b.worker is not None
        info["worker_memory"] = b.worker.memory()
    if contender in ("redis", "database") and "drain_cut" not in info:
        info["bookkeeping"] = bookkeeping(task, info)
    return analyse(scenario, contender, info, runs)


def bookkeeping(task: str, info: dict[str, Any]) -> dict[str, Any]:
    """This app's own record of the scenario's keys, once drained (invariant I6)."""
    from django.db.models import Sum

    from django_debounce.models import DebounceKey, DebounceRun

    stream = info["stream"]
    made = info.get("triggers_made", stream.count)
    labels = {f"bench.{stream.model._meta.model_name}:{pk}" for pk in stream.times}
    rows = DebounceKey.objects.filter(task_name=task, key__in=labels)
    agg = rows.aggregate(t=Sum("triggers"), p=Sum("pending"), r=Sum("runs"))
    claimed = DebounceRun.objects.filter(
        debounce_key__in=rows, outcome=DebounceRun.Outcome.SUCCESS
    ).aggregate(n=Sum("triggers"))["n"]
    triggers, pending, claimed = agg["t"] or 0, agg["p"] or 0, claimed or 0
    return {
        "triggers_made": made,
        "triggers_counted": triggers,
        "claimed_by_runs": claimed,
        "pending": pending,
        "runs_recorded": agg["r"] or 0,
        "covered": made == triggers == claimed + pending,
    }


def main() -> int:
    from bench.report import write

    only = os.environ.get("BENCH_ONLY", SCENARIOS)
    contenders = os.environ.get("BENCH_CONTENDERS", ",".join(ORDER)).split(",")
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="debounce-compare-"))
    b = Bench(tmp)

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # so that `finally` stops the worker and servers

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, stop)
    started = time.time()
    try:
        b.start()
        log(f"servers and worker up (logs in {tmp}); measuring the limits")
        lim = limits(b)
        log(f"limits: {lim}")
        results: dict[str, dict[str, Any]] = {}
        for scenario in only:
            for contender in contenders:
                log(f"scenario {scenario}: {contender} ...")
                r = run_one(b, scenario, contender)
                results.setdefault(scenario, {})[contender] = r
                log(
                    f"scenario {scenario}: {contender}: triggers {r['triggers']}, "
                    f"runs {r['runs']}, messages {r['published']}, "
                    f"overlapping {r['overlapping_runs']}, final {r['final_applied']}"
                )
    except BenchError as exc:
        print(f"bench compare: ERROR: {exc} (logs in {tmp})", file=sys.stderr)
        return 1
    finally:
        b.close()
    meta = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "scripts/bench compare",
        "seconds": round(time.time() - started),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            # the machine is shared: the load average says how much else ran meanwhile
            "load_average_before": [round(x, 1) for x in load_before],
            "load_average_after": [round(x, 1) for x in os.getloadavg()],
        },
        "worker": "celery prefork, concurrency 4, Redis broker (a server of its own)",
        "options": {"wait": b.c.WAIT, "max_wait": b.c.MAX_WAIT, "f_seconds": F_SECONDS},
    }
    ok = write(ROOT / "bench" / "results", meta, lim, results, LABELS)
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        log(f"a check failed; the worker's and servers' logs are in {tmp}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
