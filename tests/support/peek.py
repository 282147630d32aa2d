"""Read a store's state of one key straight from Redis or the database, in the shape of
``django_debounce.machine.KeyModel.view()`` (for the property test and the store tests)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def us(value: datetime | None) -> int | None:
    if value is None:
        return None
    return (value - EPOCH) // timedelta(microseconds=1)


def peek_redis(backend: Any, key_hash: str, task_name: str, collect: bool) -> dict[str, Any] | None:
    from django_debounce.backends.redis import key_id, shard_of

    client = backend.client
    base = backend.state_key(key_hash)
    raw = client.hgetall(base)
    if not raw:
        return None
    h = {k.decode(): v.decode() for k, v in raw.items()}

    def n(name: str) -> int:
        return int(h.get(name) or 0)

    def t(name: str) -> int | None:
        return n(name) or None

    def items(zkey: str) -> list[Any]:
        return [json.loads(x) for x in client.zrange(zkey, 0, -1)]

    def js(name: str) -> Any:
        return json.loads(h[name]) if h.get(name) else None

    pending = n("p")
    first = t("ft")
    last = t("lt") or (first if pending else None)
    anchor = (t("an") or first) if pending else None
    score = client.zscore(
        backend.shard_prefix(shard_of(key_hash)) + "due:" + task_name, key_id(key_hash)
    )
    return {
        "pending": pending,
        "flight_id": n("f"),
        "first": first,
        "last": last,
        "anchor": anchor,
        "bound": t("bd") if pending else None,
        "attempted": n("ac") if pending else 0,
        "due": t("d"),
        "payload": items(base + ":c") if collect else js("pl"),
        "due_fixed": bool(n("df")),
        "attempt": n("ra"),
        "not_before": t("nb"),
        "seq": n("q"),
        "taken": bool(n("tk")),
        "taken_at": t("ta") if n("tk") else None,
        "entry": int(score) if score is not None else None,
        "run_id": n("r"),
        "run_seq": n("rs") if n("ru") else 0,
        "running_until": t("ru"),
        "run_triggers": n("rt"),
        "run_payload": items(base + ":r") if collect else js("rp"),
        "run_first": t("rf"),
        "run_attempt": n("rr"),
        "run_attempted": n("rc") if n("ru") else 0,
        "run_bound": t("rb") if n("ru") else None,
        "last_run_at": t("lr"),
        "triggers": n("T"),
        "runs": n("R"),
        "merged": n("M"),
        "cancelled": n("C"),
    }


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
