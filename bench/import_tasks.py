"""The receivers of ``bench/imports.py``: one debounced ``post_save`` receiver per store, whose
run only counts itself (``RUNS`` in the store Redis), and the worker's ready flag."""

from typing import Any

from celery.signals import worker_ready
from django.db.models.signals import post_save
from django_redis import get_redis_connection

from bench.models import DatabaseStoreDoc, RedisStoreDoc
from django_debounce import debounced_receiver

READY = "bench:imports:ready"
RUNS = "bench:imports:runs"
WAIT = 5.0  # seconds: above the pump interval (flights wait in the due index), and short
# enough that a draining worker runs the import's flights while it goes on


@worker_ready.connect
def _ready(**kwargs: Any) -> None:
    get_redis_connection("default").set(READY, 1)


@debounced_receiver(post_save, sender=RedisStoreDoc, wait=WAIT, backend="redis",
                    name="bench.import_redis")  # fmt: skip
def import_redis(sender: Any, **kwargs: Any) -> None:
    get_redis_connection("default").incr(RUNS)


@debounced_receiver(post_save, sender=DatabaseStoreDoc, wait=WAIT, backend="database",
                    name="bench.import_database")  # fmt: skip
def import_database(sender: Any, **kwargs: Any) -> None:
    get_redis_connection("default").incr(RUNS)
