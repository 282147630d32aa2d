"""The tasks of the scale benchmark (``bench/scale.py``), imported by its runner and its
workers (``bench/scale_settings.py`` names this module).

Every body that the benchmark times notes its start in a file of its own process
(``BENCH_RUNS_DIR/<pid>``, one line ``tag key time``, appended with one ``os.write``): no round
trip to any server, so the note costs the bare task and the debounced one the same few
microseconds, and the runner reads the files to get run counts and start times.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import redis
from celery import shared_task
from celery.signals import worker_init, worker_process_init, worker_ready
from django.db.backends.signals import connection_created
from django.db.models.signals import post_save
from django.dispatch import receiver

import bench.celery_app  # noqa: F401  (the app every task here publishes through)
from bench.models import BenchDoc
from django_debounce import debounced_receiver, debounced_task

# The pending keys (figure 1): an hour's quiet period, nothing comes due during a run.
PENDING_WAIT = 3600
# Throughput (figure 4): long enough for trigger_many to make 5,000 keys pending before the
# first comes due, and more than DEBOUNCE_PUMP_INTERVAL, so that the pump publishes them.
# The database store's triggers are slower (a transaction per key): the runner sets
# BENCH_TP_WAIT_DATABASE from the fill rate it measured, for itself and its workers.
THROUGHPUT_WAIT = {
    "redis": float(os.environ.get("BENCH_TP_WAIT_REDIS", "5")),
    "database": float(os.environ.get("BENCH_TP_WAIT_DATABASE", "10")),
}
# Backlog (figure 5): due while no worker runs.
BACKLOG_WAIT = 2.0

_fd: tuple[int, int] | None = None


def note(tag: str, key: Any = "-") -> None:
    """Append ``tag key start-time`` to this process's run file."""
    global _fd
    now = time.time()
    pid = os.getpid()
    if _fd is None or _fd[0] != pid:
        directory = os.environ.get("BENCH_RUNS_DIR")
        if not directory:
            return
        fd = os.open(
            os.path.join(directory, str(pid)), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )
        _fd = (pid, fd)
    os.write(_fd[1], f"{tag} {key} {now:.6f}\n".encode())


# Which process this is: the runner ("client"), a worker's main process ("worker") or one of
# its pool processes ("pool"); every new database connection is noted with it and the thread.
_role = "client"


@worker_init.connect
def _in_worker(**kwargs: Any) -> None:
    global _role
    _role = "worker"


@worker_process_init.connect
def _in_pool(**kwargs: Any) -> None:
    global _role
    _role = "pool"


@receiver(connection_created)
def _session(sender: Any, connection: Any, **kwargs: Any) -> None:
    """A new PostgreSQL session: noted as ``pg_session <role>:<thread name>``."""
    thread = threading.current_thread().name.replace(" ", "-")
    note("pg_session", f"{_role}:{thread}")


@worker_ready.connect
def _ready(sender: Any = None, **kwargs: Any) -> None:
    """Tell the runner this worker consumes, and which OS thread of its main process is which
    (the consumer loop, the pump, the lease keeper, the recorder), for CPU time per thread."""
    url = os.environ.get("BENCH_STATS_URL")
    if url:
        client = redis.Redis.from_url(url)
        threads = {str(t.native_id): t.name for t in threading.enumerate() if t.native_id}
        client.hset(f"threads:{sender.hostname}", mapping=threads)
        client.set(f"ready:{sender.hostname}", os.getpid())


# -- figure 1: pending keys -----------------------------------------------------------------


@debounced_task(wait=PENDING_WAIT, backend="redis", name="scale.pending_redis")
def pending_redis(item: int) -> None:
    note("pending_redis", item)


@debounced_task(wait=PENDING_WAIT, backend="database", name="scale.pending_database")
def pending_database(item: int) -> None:
    note("pending_database", item)


@debounced_receiver(
    post_save, sender=BenchDoc, wait=PENDING_WAIT, backend="redis", name="scale.pending_receiver"
)
def pending_receiver(sender: Any, instance: Any, pk: Any, **kwargs: Any) -> None:
    note("pending_receiver", pk)


# -- figure 2: the probe --------------------------------------------------------------------


@debounced_task(wait=1, backend="redis", name="scale.probe1_redis")
def probe1_redis(key: int) -> None:
    note("probe1_redis", key)


@debounced_task(wait=3, backend="redis", name="scale.probe3_redis")
def probe3_redis(key: int) -> None:
    note("probe3_redis", key)


@debounced_task(wait=1, backend="database", name="scale.probe1_database")
def probe1_database(key: int) -> None:
    note("probe1_database", key)


@debounced_task(wait=3, backend="database", name="scale.probe3_database")
def probe3_database(key: int) -> None:
    note("probe3_database", key)


PROBES = {
    "probe1_redis": probe1_redis,
    "probe3_redis": probe3_redis,
    "probe1_database": probe1_database,
    "probe3_database": probe3_database,
}


# -- figures 4 and 5: throughput and backlog ----------------------------------------------


@shared_task(name="scale.bare")
def bare(item: int) -> None:
    note("bare", item)


@debounced_task(wait=THROUGHPUT_WAIT["redis"], backend="redis", name="scale.tp_redis")
def tp_redis(item: int) -> None:
    note("tp_redis", item)


@debounced_task(wait=THROUGHPUT_WAIT["database"], backend="database", name="scale.tp_database")
def tp_database(item: int) -> None:
    note("tp_database", item)


@debounced_task(wait=BACKLOG_WAIT, backend="redis", name="scale.backlog_redis")
def backlog_redis(item: int) -> None:
    note("backlog_redis", item)


@debounced_task(wait=BACKLOG_WAIT, backend="database", name="scale.backlog_database")
def backlog_database(item: int) -> None:
    note("backlog_database", item)


THROUGHPUT = {"redis": tp_redis, "database": tp_database}
BACKLOG = {"redis": backlog_redis, "database": backlog_database}
