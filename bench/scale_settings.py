"""Settings of the scale benchmark (``bench/scale.py``): the benchmark settings with the scale
benchmark's tasks instead of the comparison's contenders, the Redis store on a server of its
own (``DEBOUNCE_REDIS_URL``, so ``INFO commandstats`` counts this app's commands alone), and
``CELERY_DB_REUSE_MAX`` when ``BENCH_DB_REUSE_MAX`` is set (the database store's runs)."""

import os

from bench.settings import *  # noqa: F403

BENCH_TASKS = "bench.scale_tasks"
DEBOUNCE_REDIS_URL = os.environ["BENCH_STORE_URL"]
if os.environ.get("BENCH_DB_REUSE_MAX"):
    CELERY_DB_REUSE_MAX = int(os.environ["BENCH_DB_REUSE_MAX"])
