"""Live pending counts for ``DebounceKey`` rows: the row's, plus the triggers a Redis counter
absorbed that no step folded into the row yet (docs/design.md, "One record per key": derived,
may lag). The admin and ``debounce_status`` show them.
"""

from __future__ import annotations

from collections.abc import Sequence

from django_debounce.backends import get_backend
from django_debounce.backends.redis import redis_configured
from django_debounce.models import DebounceKey


def refresh(rows: Sequence[DebounceKey]) -> None:
    """Give every row ``live_pending`` (the pending count shown) and ``live`` (``True`` when
    a Redis counter added to it). One Redis round trip for all rows when the Redis store is
    configured; none otherwise. When Redis cannot be read, the rows show their own count."""
    for row in rows:
        row.live_pending = row.pending  # type: ignore[attr-defined]
        row.live = False  # type: ignore[attr-defined]
    held = [row for row in rows if row.pending and row.counter_until is not None]
    if not held or not redis_configured():
        return
    counted = get_backend("redis").counted([row.key_hash for row in held])  # type: ignore[attr-defined]
    for row in held:
        n = counted.get(row.key_hash, 0)
        if n:
            row.live_pending = row.pending + n  # type: ignore[attr-defined]
            row.live = True  # type: ignore[attr-defined]
