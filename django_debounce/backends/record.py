"""The durable record of keys whose live state is in Redis: the ``DebounceKey`` row (and the
``DebounceRun`` rows, written by ``recorder.py`` from the records the scripts append).

The Redis store writes a key's row itself only when a flight opens (so recovery can rebuild
a flight whose Redis state was lost, and the admin lists the key); claims, finishes and lost
runs reach the row through the records. Writes are best effort: Redis has already committed
the step, so a database error is logged and the caller goes on.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from datetime import timezone as dt_timezone

from django.db import DatabaseError, router

logger = logging.getLogger("django_debounce")

US = 1_000_000


def _dt(us: int) -> datetime | None:
    if us <= 0:
        return None
    return datetime.fromtimestamp(us / US, tz=dt_timezone.utc)


def _recheck(attention: datetime | None) -> datetime | None:
    """When to compare a record with Redis: ``DEBOUNCE_DISPATCH_GRACE`` after the time the key
    next needs attention (by then a claim or finish has normally reached the record)."""
    from datetime import timedelta

    from django_debounce import conf

    if attention is None:
        return None
    return attention + timedelta(seconds=conf.seconds_of("DISPATCH_GRACE"))


def synced(row: object, pending: int, running_until: int, due: int) -> None:
    """Bring the record ``row`` of a key Redis holds up to its live state (pending count,
    state, due time) and set its next recheck."""
    from django_debounce.models import DebounceKey

    state = (
        DebounceKey.State.RUNNING
        if running_until
        else DebounceKey.State.PENDING
        if pending
        else DebounceKey.State.IDLE
    )
    attention = _dt(running_until) if running_until else _dt(due) if pending else None
    DebounceKey.objects.using(alias()).filter(pk=row.pk).update(  # type: ignore[attr-defined]
        state=state,
        pending=pending,
        due_at=_dt(due) if pending else None,
        running_until=_dt(running_until),
        recheck_at=_recheck(attention),
    )


def rechecked(row: object) -> None:
    """The flight of ``row`` was rebuilt in Redis: look again after its due time."""
    from django.utils import timezone

    from django_debounce.models import DebounceKey

    DebounceKey.objects.using(alias()).filter(pk=row.pk).update(  # type: ignore[attr-defined]
        recheck_at=_recheck(timezone.now())
    )


def recheck_later(key_hash: str, store: str) -> None:
    """Ask for a recheck of the record of ``key_hash`` one ``DEBOUNCE_DISPATCH_GRACE`` from now
    (a run of the previous release is live: its flight is adopted after it)."""
    from django.utils import timezone

    from django_debounce.models import DebounceKey

    DebounceKey.objects.using(alias()).filter(key_hash=key_hash).update(
        recheck_at=_recheck(timezone.now())
    )


def alias() -> str:
    """The database the records are written to (``router.db_for_write(DebounceKey)``)."""
    from django_debounce.models import DebounceKey

    return router.db_for_write(DebounceKey)


def seed(key_hash: str) -> str:
    """``"run_id,flight_id,triggers,runs,merged,cancelled"`` of the key's row (zeros when it
    has none): a key new to Redis continues its counters from them."""
    from django_debounce.models import DebounceKey

    row = (
        DebounceKey.objects.using(alias())
        .filter(key_hash=key_hash)
        .values_list("run_id", "flight_id", "triggers", "runs", "merged", "cancelled")
        .first()
    )
    return ",".join(str(v) for v in (row or (0, 0, 0, 0, 0, 0)))


def opened(
    *,
    key_hash: str,
    key: str,
    task_name: str,
    at_us: int,
    state: str,
    pending: int,
    flight_id: int,
    due_us: int,
    payload_json: str | None,
    totals: tuple[int, int, int, int, int],
    lost_run: int,
    store: str,
) -> None:
    """Write the row of a key whose flight opened at ``at_us`` (or whose lost run a trigger
    recovered): created when new, else brought up to date unless a later change already
    reached it (its ``updated_at`` is newer)."""
    from django_debounce.models import DebounceKey, DebounceRun

    triggers, runs, merged, cancelled, run_id = totals
    at = _dt(at_us)
    fields = {
        "state": state,
        "pending": pending,
        "flight_id": flight_id,
        "first_trigger_at": at,
        "last_trigger_at": at,
        "due_at": _dt(due_us),
        "payload": json.loads(payload_json) if payload_json is not None else None,
        "triggers": triggers,
        "runs": runs,
        "merged": merged,
        "cancelled": cancelled,
        "run_id": run_id,
        "store": store,
        "updated_at": at,
        "recheck_at": _recheck(_dt(due_us) or at),
    }
    db = alias()
    try:
        updated = (
            DebounceKey.objects.using(db)
            .filter(key_hash=key_hash, updated_at__lte=at)
            .update(**fields)
        )
        if not updated:
            DebounceKey.objects.using(db).bulk_create(
                [DebounceKey(key_hash=key_hash, key=key, task_name=task_name, **fields)],
                ignore_conflicts=True,
            )
        if lost_run:
            DebounceRun.objects.using(db).filter(
                debounce_key__key_hash=key_hash,
                store=store,
                run_id=lost_run,
                outcome=DebounceRun.Outcome.RUNNING,
            ).update(outcome=DebounceRun.Outcome.LOST, finished_at=at, error="lease ran out")
    except DatabaseError:
        logger.exception("django_debounce: could not record key %s in the database", key_hash)
