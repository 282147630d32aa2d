"""Read a store's state of one key straight from Redis or the database, in the shape of
``django_debounce.machine.KeyModel.view()`` (for the property test and the store tests)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django_debounce.backends.redis import options_of

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def us(value: datetime | None) -> int | None:
    if value is None:
        return None
    return (value - EPOCH) // timedelta(microseconds=1)


def peek_redis(backend: Any, key_hash: str, cfg: Any) -> dict[str, Any] | None:
    """The row of ``key_hash`` with what its Redis counter counted folded in (as the next
    step that seals the counter will fold it); ``cfg``: the task's ``machine.Config``; the
    test's fake clock (the counters' times are its times)."""
    rows = backend.rows()
    rows.clock(EPOCH)  # the counters' times are the fake clock's: no conversion
    record = rows.read(key_hash, cfg)
    if record is None:
        return None
    view = peek_database(key_hash, cfg.collect)
    assert view is not None
    before = record.key.view()
    cid, n, t, sealed, fp = backend.client.hmget(backend.counter_key(key_hash), *"intsf")
    if record.counter_until is not None and record.key.pending and n and not sealed:
        if int(n) > 0 and int(cid) <= record.counter_id:
            record.key.fold(int(n), int(t), *options_of(fp))
    after = record.key.view()
    for field in ("pending", "triggers", "last", "due", "bound"):
        if after[field] != before[field]:
            view[field] = after[field]
    return view


def peek_store(backend: Any, key_hash: str, collect: bool = False) -> dict[str, Any] | None:
    """The state of ``key_hash`` in ``backend`` (the Redis store: the row with what its counter
    counted folded in; the database store: the row); ``collect``: the key's task collects."""
    from django_debounce.backends.redis import RedisBackend
    from django_debounce.machine import Config

    if isinstance(backend, RedisBackend):
        cfg = Config(0, None, False, True, False, 1 if collect else None, 0)
        return peek_redis(backend, key_hash, cfg)
    return peek_database(key_hash, collect)


def peek_database(key_hash: str, collect: bool) -> dict[str, Any] | None:
    from django_debounce.models import DebounceDue, DebounceKey

    row = DebounceKey.objects.filter(key_hash=key_hash).first()
    if row is None:
        return None
    entry = DebounceDue.objects.filter(key_hash=key_hash).values_list("due_at", flat=True).first()
    return {
        "pending": row.pending,
        "flight_id": row.flight_id,
        "first": us(row.first_trigger_at),
        "last": us(row.last_trigger_at),
        "anchor": us(row.anchor_at) if row.pending else None,
        "bound": us(row.bound_at) if row.pending else None,
        "attempted": row.attempted if row.pending else 0,
        "due": us(row.due_at),
        "payload": (row.payload or []) if collect else row.payload,
        "due_fixed": row.due_fixed,
        "attempt": row.attempt,
        "not_before": us(row.not_before),
        "seq": row.scheduled_seq,
        "taken": row.scheduled,
        "taken_at": us(row.scheduled_at) if row.scheduled else None,
        "entry": us(entry),
        "run_id": row.run_id,
        "run_seq": row.run_seq if row.running_until else 0,
        "running_until": us(row.running_until),
        "run_triggers": row.run_triggers,
        "run_payload": (row.run_payload or []) if collect else row.run_payload,
        "run_first": us(row.run_first_trigger_at),
        "run_attempt": row.run_attempt,
        "run_attempted": row.run_attempted if row.running_until else 0,
        "run_bound": us(row.run_bound_at) if row.running_until else None,
        "last_run_at": us(row.last_run_at),
        "triggers": row.triggers,
        "runs": row.runs,
        "merged": row.merged,
        "cancelled": row.cancelled,
    }
