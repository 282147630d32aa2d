"""Live values for ``DebounceKey`` rows whose state the Redis store holds.

The Redis store writes a key's row only on flight transitions (open, claim, finish), so a
row mirrored from Redis shows the pending count, last trigger and due time of the moment its
flight opened. The admin and ``debounce_status`` read the live values of the rows they show
from Redis, in one pipeline, and fall back to the row when Redis does not answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django_debounce.backends import get_backend
from django_debounce.models import DebounceKey

logger = logging.getLogger("django_debounce")


def _redis_store() -> Any:
    backend = get_backend()
    if backend.name == "redis":
        return backend
    if backend.name == "auto":
        return backend.redis  # type: ignore[attr-defined]  # None: the cache is not django-redis
    # The configured store is the database, but a task may keep its keys in Redis (backend=).
    return get_backend("redis")


def refresh(rows: Sequence[DebounceKey]) -> None:
    """Overwrite the mirrored fields of ``rows`` held in Redis with their live values.

    Every row gets ``live_pending`` (the pending count shown) and ``live`` (``True`` when the
    values came from Redis). One Redis round trip for all rows; no database query. When Redis
    cannot be read, the rows keep the durable record and a warning is logged.
    """
    for row in rows:
        row.live_pending = row.pending  # type: ignore[attr-defined]
        row.live = False  # type: ignore[attr-defined]
    held = [row for row in rows if row.store == "redis"]
    if not held:
        return
    try:
        store = _redis_store()
        values = store.live_rows([row.key_hash for row in held]) if store is not None else {}
    except Exception:  # the page still shows the durable record when Redis is down
        logger.warning("django_debounce: live values from Redis unavailable", exc_info=True)
        return
    for row in held:
        live = values.get(row.key_hash)
        if not live:
            continue
        for name, value in live.items():
            setattr(row, name, value)
        row.live_pending = row.pending  # type: ignore[attr-defined]
        row.live = True  # type: ignore[attr-defined]
