"""The tasks of the scale benchmark (``bench/scale.py``), imported by its runner and its
workers (``bench/scale_settings.py`` names this module).

Every body that the benchmark times notes its start with ``bench.scale_hooks.note`` (a line in
a file of its own process: no round trip to any server).
"""

from __future__ import annotations

import os
from typing import Any

from celery import shared_task
from django.db.models.signals import post_save

import bench.celery_app  # noqa: F401  (the app every task here publishes through)
from bench.models import BenchDoc
from bench.scale_hooks import note
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
# Redis restarted empty (figure 6): long enough for trigger_many to make every key pending
# before the first comes due; the runner sets it from the fill rate it measured.
RESTART_WAIT = float(os.environ.get("BENCH_RESTART_WAIT", "30"))

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


@debounced_task(wait=RESTART_WAIT, backend="redis", name="scale.restart_redis")
def restart_redis(item: int) -> None:
    note("restart_redis", item)
