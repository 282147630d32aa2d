"""The contenders of the comparison benchmark, each wired to ``post_save`` of its own proxy of
``BenchDoc`` (so every contender sees the same saves of the same table).

Every job does the same thing: note its start, read the row (``version``, ``job_ms``), sleep
``job_ms``, and record ``[contender, pk, version seen, start, end, pid, triggers]`` in the stats
Redis. Publishes are counted with Celery's ``before_task_publish`` in every process (the
runner, the trigger processes and the worker's pool), and the worker counts tasks in flight,
so the runner knows when a contender has drained.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from functools import partial
from typing import Any

import redis
from celery import shared_task
from celery.signals import before_task_publish, task_postrun, task_prerun, worker_ready
from celery_once import QueueOnce
from celery_singleton import Singleton
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver
from django_redis import get_redis_connection

import bench.celery_app  # noqa: F401  (the app every task here publishes through)
from bench.models import (
    BenchDoc,
    CounterDoc,
    DatabaseStoreDoc,
    OnceDoc,
    PerSaveDoc,
    RedisStoreDoc,
    SingletonDoc,
)
from django_debounce import RunInfo, debounced_receiver

# Options of every scenario (those of scenario b): quiet period and its bound, in seconds.
WAIT = 0.05
MAX_WAIT = 0.5

RUNS = "bench:runs"
STARTED = "bench:started"
PUBLISHED = "bench:published"
INFLIGHT = "bench:inflight"
READY = "bench:worker_ready"

# contender -> (proxy model, Celery task name whose messages it publishes)
CONTENDERS: dict[str, tuple[type[BenchDoc], str]] = {
    "per_save": (PerSaveDoc, "bench.per_save"),
    "counter": (CounterDoc, "bench.counter"),
    "once": (OnceDoc, "bench.once"),
    "singleton": (SingletonDoc, "bench.singleton"),
    "redis": (RedisStoreDoc, "bench.debounce_redis"),
    "database": (DatabaseStoreDoc, "bench.debounce_database"),
}

_published: Counter[str] = Counter()
_clients: dict[str, tuple[int, redis.Redis]] = {}


def stats() -> redis.Redis:
    """The stats Redis (run records, publish counts): a server of its own, never measured."""
    pid, client = _clients.get("stats", (0, None))  # type: ignore[assignment]
    if pid != os.getpid() or client is None:
        client = redis.Redis.from_url(os.environ["BENCH_STATS_URL"])
        _clients["stats"] = (os.getpid(), client)
    return client


def flush_published() -> None:
    """Add this process's publish counts to the stats Redis (one round trip, off the hot path)."""
    if not _published:
        return
    pipe = stats().pipeline(transaction=False)
    for name, n in _published.items():
        pipe.hincrby(PUBLISHED, name, n)
    pipe.execute()
    _published.clear()


@before_task_publish.connect
def _count_publish(sender: str | None = None, **kwargs: Any) -> None:
    _published[str(sender)] += 1


@worker_ready.connect
def _ready(**kwargs: Any) -> None:
    stats().set(READY, os.getpid())


@task_prerun.connect
def _prerun(**kwargs: Any) -> None:
    stats().incr(INFLIGHT)


@task_postrun.connect
def _postrun(**kwargs: Any) -> None:
    flush_published()
    stats().decr(INFLIGHT)


def _job(contender: str, pk: int, version: int, job_ms: int, start: float, triggers: Any) -> None:
    client = stats()
    if job_ms:  # only jobs that take time announce their start and end (scenario c waits)
        client.publish(STARTED, f"{contender}:{pk}:+")
        time.sleep(job_ms / 1000)
    end = time.time()
    pipe = client.pipeline(transaction=False)
    pipe.rpush(RUNS, json.dumps([contender, pk, version, start, end, os.getpid(), triggers]))
    if job_ms:
        pipe.publish(STARTED, f"{contender}:{pk}:-")
    pipe.execute()


def _work(contender: str, pk: int) -> None:
    start = time.time()
    row = BenchDoc.objects.filter(pk=pk).values_list("version", "job_ms").first()
    if row is None:  # a message left by an earlier run of the benchmark
        return
    _job(contender, pk, row[0], row[1], start, None)


# -- a Celery task per save -------------------------------------------------------------------


@shared_task(name="bench.per_save")
def per_save_job(pk: int) -> None:
    _work("per_save", pk)


@receiver(post_save, sender=PerSaveDoc, dispatch_uid="bench.per_save")
def _per_save(sender: Any, instance: BenchDoc, using: str, **kwargs: Any) -> None:
    transaction.on_commit(partial(per_save_job.delay, instance.pk), using=using)


# -- the counter pattern ----------------------------------------------------------------------


def counter_key(pk: int) -> str:
    return f"bench:counter:{pk}"


@shared_task(name="bench.counter")
def counter_job(pk: int) -> None:
    """Runs the work only when the last save's countdown task drains the counter."""
    if get_redis_connection("default").decr(counter_key(pk)) > 0:
        return
    _work("counter", pk)


def _counter_trigger(pk: int) -> None:
    get_redis_connection("default").incr(counter_key(pk))
    counter_job.apply_async((pk,), countdown=WAIT)


@receiver(post_save, sender=CounterDoc, dispatch_uid="bench.counter")
def _counter(sender: Any, instance: BenchDoc, using: str, **kwargs: Any) -> None:
    transaction.on_commit(partial(_counter_trigger, instance.pk), using=using)


# -- celery-once: QueueOnce, graceful (a duplicate returns instead of raising) ----------------


@shared_task(name="bench.once", base=QueueOnce, once={"graceful": True})
def once_job(pk: int) -> None:
    _work("once", pk)


@receiver(post_save, sender=OnceDoc, dispatch_uid="bench.once")
def _once(sender: Any, instance: BenchDoc, using: str, **kwargs: Any) -> None:
    transaction.on_commit(partial(once_job.delay, instance.pk), using=using)


# -- celery-singleton: Singleton (a duplicate returns the queued task's AsyncResult) ----------


@shared_task(name="bench.singleton", base=Singleton)
def singleton_job(pk: int) -> None:
    _work("singleton", pk)


@receiver(post_save, sender=SingletonDoc, dispatch_uid="bench.singleton")
def _singleton(sender: Any, instance: BenchDoc, using: str, **kwargs: Any) -> None:
    transaction.on_commit(partial(singleton_job.delay, instance.pk), using=using)


# -- this app, on each store ------------------------------------------------------------------


def _debounced(contender: str, instance: BenchDoc | None, pk: int, debounce: RunInfo) -> None:
    start = time.time()
    if instance is None:
        return
    _job(contender, pk, instance.version, instance.job_ms, start, debounce.triggers)


@debounced_receiver(
    post_save,
    sender=RedisStoreDoc,
    wait=WAIT,
    max_wait=MAX_WAIT,
    backend="redis",
    name="bench.debounce_redis",
)
def debounce_redis(sender: Any, instance: Any, pk: Any, debounce: RunInfo, **kwargs: Any) -> None:
    _debounced("redis", instance, pk, debounce)


@debounced_receiver(
    post_save,
    sender=DatabaseStoreDoc,
    wait=WAIT,
    max_wait=MAX_WAIT,
    backend="database",
    name="bench.debounce_database",
)
def debounce_database(
    sender: Any, instance: Any, pk: Any, debounce: RunInfo, **kwargs: Any
) -> None:
    _debounced("database", instance, pk, debounce)


@shared_task(name="bench.noop")
def noop() -> None:
    """The bare publish of the limits (published to a queue no worker reads)."""
