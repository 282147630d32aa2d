"""Settings of the scale benchmark (``bench/scale.py``): the benchmark settings with the scale
benchmark's tasks instead of the comparison's contenders, the Redis store on a server of its
own (``DEBOUNCE_REDIS_URL``, so ``INFO commandstats`` counts this app's commands alone; on the
Redis Cluster with ``BENCH_REDIS_CLUSTER``), and ``CELERY_DB_REUSE_MAX`` when
``BENCH_DB_REUSE_MAX`` is set (the database store's runs)."""

import os

from bench.settings import *  # noqa: F403

# a worker of the idle phase by task count registers BENCH_IDLE_TASKS tasks and no other
BENCH_TASKS = "bench.idle_tasks" if os.environ.get("BENCH_IDLE_TASKS") else "bench.scale_tasks"
DEBOUNCE_REDIS_URL = os.environ["BENCH_STORE_URL"]
if os.environ.get("BENCH_REDIS_CLUSTER"):  # the store on the 3-master cluster (figure 7)
    DEBOUNCE_REDIS_CLUSTER = os.environ["BENCH_REDIS_CLUSTER"].split(",")
if os.environ.get("BENCH_DB_REUSE_MAX"):
    CELERY_DB_REUSE_MAX = int(os.environ["BENCH_DB_REUSE_MAX"])
