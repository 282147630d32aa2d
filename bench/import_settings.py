"""Settings of ``bench/imports.py``: those of the benchmarks, with its receivers."""

from bench.settings import *  # noqa: F403

BENCH_TASKS = "bench.import_tasks"
