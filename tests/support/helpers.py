"""Polling with deadlines, the repository root and the Redis flush: what tests, fixtures and
helper modules share (import from here, never from ``conftest.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent.parent  # the repository


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float = 20.0,
    interval: float = 0.05,
    message: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def stays(predicate: Callable[[], Any], *, duration: float, interval: float = 0.05) -> bool:
    """True when ``predicate`` holds for the whole of ``duration`` seconds (checked by polling)."""
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(interval)
    return bool(predicate())


def flush_redis() -> None:
    """Empty the Redis of the cache alias and, in the Redis Cluster run
    (``DEBOUNCE_REDIS_CLUSTER``), every master of the cluster."""
    redis.Redis.from_url(settings.CACHES["default"]["LOCATION"]).flushdb()
    nodes = getattr(settings, "DEBOUNCE_REDIS_CLUSTER", None)
    if nodes:
        for node in nodes:
            host, _, port = node.rpartition(":")
            client = redis.Redis(host=host or "127.0.0.1", port=int(port))
            if client.info("replication").get("role") == "master":
                client.flushall()
            client.close()
