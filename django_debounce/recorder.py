"""The recorder: brings the durable record (``DebounceKey`` and ``DebounceRun`` rows) of keys
held in Redis up to date, in batches, from the records the Lua scripts append (docs/design.md,
"The durable record").

The Redis store's scripts append one record per claim, finish, lost run and cancel to their
shard's list (``<prefix>{<shard>}:rec``); a pool process never writes the database for a run
on the Redis store. The recorder runs in the workers' main processes (beside the pump): it
drains the lists after local runs finish, and every few seconds anyway (records of workers
that died), and applies a batch in a handful of statements whatever its size. A batch that
cannot be written goes back to its list.

Record fields (``|``-separated, see ``record()`` in common.lua): kind, key id, task name,
time, then the key's pending, flight id, first and last trigger, due time, run id, lease
end, totals (triggers, runs, merged, cancelled), last run, the run id the record is about,
and what the kind adds: a claim its flight, claimed triggers, first/last trigger, due time
and attempt; a finish its outcome, the triggers the run covered and the error text.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction

from django_debounce import conf

logger = logging.getLogger("django_debounce")

US = 1_000_000
BATCH = 1000


def _dt(us: int) -> datetime | None:
    if us <= 0:
        return None
    return datetime.fromtimestamp(us / US, tz=UTC)


# The numeric fields of a record, in their order (after kind, key id and task name).
NUMBERS = (
    "at",
    "pending",
    "flight_id",
    "first",
    "last",
    "due",
    "run_id",
    "running_until",
    "triggers",
    "runs",
    "merged",
    "cancelled",
    "last_run",
    "about_run",
)


@dataclass
class Record:
    kind: str
    key_hash: str
    task_name: str
    at: int
    pending: int
    flight_id: int
    first: int
    last: int
    due: int
    run_id: int
    running_until: int
    triggers: int
    runs: int
    merged: int
    cancelled: int
    last_run: int
    about_run: int
    extra: str
    raw: bytes | str

    @classmethod
    def parse(cls, raw: bytes | str) -> Record:
        from django_debounce.backends.redis import key_hash_of

        text = raw.decode() if isinstance(raw, bytes) else raw
        parts = text.split("|", 17)
        numbers = dict(zip(NUMBERS, (int(x) for x in parts[3:17]), strict=True))
        return cls(parts[0], key_hash_of(parts[1]), parts[2], extra=parts[17], raw=raw, **numbers)


def redis_stores() -> list[Any]:
    """The Redis stores the registered debounced tasks use (each once)."""
    from django_debounce.backends.redis import RedisBackend
    from django_debounce.tasks import registered_debounced_tasks

    out: dict[int, Any] = {}
    for task in registered_debounced_tasks():
        backend = task.get_backend()
        redis = backend if isinstance(backend, RedisBackend) else getattr(backend, "redis", None)
        if isinstance(redis, RedisBackend):
            out[id(redis)] = redis
    return list(out.values())


def drain(store: Any, limit: int = BATCH) -> int:
    """Apply up to ``limit`` records of every shard of ``store`` to the database; returns how
    many were applied."""
    from django_debounce.backends.redis import SHARDS

    lists = [store.shard_prefix(shard) + "rec" for shard in range(SHARDS)]
    if store.cluster:
        raw = [store.client.lpop(name, limit) or [] for name in lists]
    else:
        pipe = store.client.pipeline(transaction=False)
        for name in lists:
            pipe.lpop(name, limit)
        raw = [got or [] for got in pipe.execute()]
    records = []
    for name, items in zip(lists, raw, strict=True):
        for item in items:
            try:
                records.append((name, Record.parse(item)))
            except (ValueError, IndexError):
                logger.error("django_debounce: malformed record dropped: %r", item)
    if not records:
        return 0
    try:
        apply([r for _name, r in records])
    except DatabaseError:
        logger.exception("django_debounce: could not write %d records; kept", len(records))
        pipe = store.client.pipeline(transaction=False)
        for name, record in reversed(records):  # back at the head, in their order
            pipe.lpush(name, record.raw)
        pipe.execute()
        return 0
    return len(records)


def drain_all() -> int:
    """Drain every record of the Redis stores in use now (``run_due`` and in-process runs:
    no recorder runs in such a process). Returns how many records were applied."""
    applied = 0
    for store in redis_stores():
        while True:
            n = drain(store)
            applied += n
            if n < BATCH:
                break
    return applied


def apply(records: list[Record]) -> None:
    """Write ``records`` (in the order they were made) to the durable record: one statement
    each for the keys, the new runs and the ended runs, whatever the batch size.

    The records of one key are applied in the order its scripts made them (one shard's list),
    not by their times: a step given ``now=`` (``run_due`` claims at a time of its own, the
    finish after it takes the store's clock) may record a time earlier than the step before.

    A row that the database store holds with a flight or a run of its own (the ``auto``
    store fell back to it while Redis failed) keeps that state: the records of the key's
    Redis flights still write their runs, and take the row back once it is idle."""
    from django_debounce.backends.record import alias

    db = alias()
    grace = timedelta(seconds=conf.seconds_of("DISPATCH_GRACE"))
    with transaction.atomic(using=db):
        rows = _rows_of(db, records)
        latest, new_runs, ended = _runs_of(rows, records)
        _write_runs(db, new_runs, ended)
        _write_keys(db, rows, latest, grace)


# What ends a run: (outcome, finished_at, error, the triggers it covered when a give-up says)
_End = tuple[str, datetime | None, str, int | None]


def _rows_of(db: str, records: list[Record]) -> dict[str, Any]:
    """The ``DebounceKey`` rows of the records' keys, created (a bare row) for keys that have
    none yet, by key hash."""
    from django_debounce.models import DebounceKey

    hashes = {r.key_hash for r in records}
    fields = ("pk", "key_hash", "updated_at", "last_outcome", "store", "state", "recheck_at")
    keys = DebounceKey.objects.using(db)
    # locked: a row the database store holds (it took the key over during a Redis outage and
    # has a flight or run there) keeps its state; only its runs are recorded (_write_keys)
    rows = {
        row.key_hash: row
        for row in keys.select_for_update().filter(key_hash__in=hashes).only(*fields)
    }
    missing = [h for h in hashes if h not in rows]
    if missing:
        firsts = {r.key_hash: r for r in reversed(records)}
        keys.bulk_create(
            [
                DebounceKey(key_hash=h, key=h, task_name=firsts[h].task_name, store="redis")
                for h in missing
            ],
            ignore_conflicts=True,
        )
        for row in keys.filter(key_hash__in=missing).only(*fields):
            rows[row.key_hash] = row
    return rows


def _runs_of(
    rows: dict[str, Any], records: list[Record]
) -> tuple[dict[str, Record], dict[tuple[int, int], Any], dict[tuple[int, int], _End]]:
    """Walk the records in order: the latest record of each key, the runs claimed (new
    ``DebounceRun`` rows, already ended when their end is in the batch too) and the ends of
    runs claimed before the batch, by (key pk, run id)."""
    from django_debounce.models import DebounceRun

    latest: dict[str, Record] = {}
    new_runs: dict[tuple[int, int], Any] = {}  # DebounceRun rows
    ended: dict[tuple[int, int], _End] = {}
    for r in records:
        row = rows.get(r.key_hash)
        if row is None:
            continue
        latest[r.key_hash] = r
        if r.kind == "c":
            flight, claimed, first, last, due, attempt = (int(x) for x in r.extra.split(","))
            new_runs[(row.pk, r.about_run)] = DebounceRun(
                debounce_key_id=row.pk,
                store="redis",
                task_name=r.task_name,
                flight_id=flight,
                run_id=r.about_run,
                attempt=attempt,
                triggers=claimed,
                first_trigger_at=_dt(first),
                last_trigger_at=_dt(last),
                due_at=_dt(due),
                started_at=_dt(r.at),
                delay=max((r.at - last) / US, 0.0),
            )
        elif r.kind in ("f", "l"):
            covered: int | None = None
            if r.kind == "f":
                outcome, _, rest = r.extra.partition("|")
                count, _, error = rest.partition("|")
                covered = int(count) if count.isdigit() else None
            else:
                outcome, error = str(DebounceRun.Outcome.LOST), "lease ran out"
            ended[(row.pk, r.about_run)] = (outcome, _dt(r.at), error, covered)
    for (pk, run_id), (outcome, at, error, covered) in list(ended.items()):
        run = new_runs.get((pk, run_id))
        if run is not None:  # claimed and ended within the batch: one row, already ended
            run.outcome, run.finished_at, run.error = outcome, at, error
            if covered is not None:
                run.triggers = covered
            del ended[(pk, run_id)]
    return latest, new_runs, ended


def _write_runs(
    db: str, new_runs: dict[tuple[int, int], Any], ended: dict[tuple[int, int], _End]
) -> None:
    """Insert the new runs, then end the runs claimed before: three statements at most."""
    from django_debounce.backends.record import update_rows
    from django_debounce.models import DebounceRun

    if new_runs:
        DebounceRun.objects.using(db).bulk_create(list(new_runs.values()), ignore_conflicts=True)
    if not ended:
        return
    runs = DebounceRun.objects.using(db).filter(
        debounce_key_id__in={pk for pk, _ in ended},
        store="redis",
        run_id__in={run_id for _, run_id in ended},
        outcome=DebounceRun.Outcome.RUNNING,
    )
    changed = []
    for run in runs:
        end = ended.get((run.debounce_key_id, run.run_id))
        if end is None:
            continue
        run.outcome, run.finished_at, run.error, covered = end
        if covered is not None:
            run.triggers = covered  # a give-up covers only the attempted triggers
        changed.append(run)
    fields = ["outcome", "finished_at", "error", "triggers"]
    update_rows(
        db, DebounceRun, fields, [(r.pk, *(getattr(r, f) for f in fields)) for r in changed]
    )


# The DebounceKey fields a record sets (the Redis field legend, docs/design.md).
_KEY_FIELDS = [
    "state",
    "pending",
    "flight_id",
    "first_trigger_at",
    "last_trigger_at",
    "due_at",
    "run_id",
    "running_until",
    "triggers",
    "runs",
    "merged",
    "cancelled",
    "last_run_at",
    "last_outcome",
    "store",
    "updated_at",
    "recheck_at",
]


def _write_keys(db: str, rows: dict[str, Any], latest: dict[str, Record], grace: timedelta) -> None:
    """Set each key's row from its latest record (unless a later change reached the row
    first), in one statement; ``recheck_at`` is when the recheck compares it with Redis."""
    from django_debounce.backends.record import update_rows
    from django_debounce.models import DebounceKey, DebounceRun

    keys = []
    forget = []
    for key_hash, r in latest.items():
        row = rows[key_hash]
        at = _dt(r.at)
        if row.store == "database" and row.state != DebounceKey.State.IDLE:
            # the database store's flight: never overwritten from Redis; once Redis says the
            # key is idle, no flight of Redis is left beside it (record.mark_beside)
            beside = row.recheck_at
            if beside is not None and at is not None and at >= beside:
                if not r.pending and not r.running_until:
                    forget.append((row.pk, at))
            continue
        if row.updated_at is not None and at is not None and row.updated_at > at:
            continue  # a later change reached the row first
        row.state = (
            DebounceKey.State.RUNNING
            if r.running_until
            else DebounceKey.State.PENDING
            if r.pending
            else DebounceKey.State.IDLE
        )
        row.pending = r.pending
        row.flight_id = r.flight_id
        row.first_trigger_at = _dt(r.first)
        row.last_trigger_at = _dt(r.last) or _dt(r.first)
        row.due_at = _dt(r.due)
        row.run_id = r.run_id
        row.running_until = _dt(r.running_until)
        row.triggers = r.triggers
        row.runs = r.runs
        row.merged = r.merged
        row.cancelled = r.cancelled
        row.last_run_at = _dt(r.last_run)
        if r.kind == "f":
            row.last_outcome = r.extra.partition("|")[0]
        elif r.kind == "l":
            row.last_outcome = DebounceRun.Outcome.LOST
        row.store = "redis"
        row.updated_at = at
        attention = row.running_until if row.running_until else row.due_at if r.pending else None
        row.recheck_at = attention + grace if attention is not None else None
        keys.append(row)
    rows_ = [(row.pk, *(getattr(row, f) for f in _KEY_FIELDS)) for row in keys]
    update_rows(db, DebounceKey, _KEY_FIELDS, rows_)
    for pk, at in forget:  # rare: records of Redis beside a database store's flight
        DebounceKey.objects.using(db).filter(pk=pk, store="database", recheck_at__lte=at).update(
            recheck_at=None
        )


class Recorder:
    """Drains the records of the Redis stores in use into the database: soon after local
    runs end (``worker_state`` counts them), and every ``SWEEP`` seconds anyway."""

    SWEEP = 5.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        self._seen = -1
        self._last = 0.0
        self.applied = 0

    def _finished(self) -> int:
        from celery.worker import state

        return sum(state.total_count.values())

    def tick(self, *, force: bool = False) -> None:
        """Drain the records when local runs ended since the last drain, every ``SWEEP``
        seconds anyway, or with ``force``."""
        finished = self._finished()
        now = time.monotonic()
        if not force and finished == self._seen and now - self._last < self.SWEEP:
            return
        self._seen, self._last = finished, now
        from django_debounce.dbconn import fork_pending

        for store in redis_stores():
            try:
                while True:
                    n = drain(store)
                    self.applied += n
                    if n < BATCH:
                        break
                    if fork_pending():  # the pool forks: the next tick drains the rest
                        self._seen = -1
                        return
            except Exception:
                logger.exception("django_debounce: recorder failed")

    def run(self) -> None:
        from django_debounce.dbconn import thread_tick

        while not self._stop.is_set():
            try:
                with thread_tick():
                    self.tick()
            except Exception:  # tick() logs its own failures; this is the connections' tidying
                logger.exception("django_debounce: recorder tick failed")
            self._stop.wait(0.5)

    def start(self) -> None:
        from django_debounce.dbconn import closing

        self._stop.clear()
        self.thread = threading.Thread(
            target=closing(self.run), name="django-debounce recorder", daemon=True
        )
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self.thread is not None:
            self.thread.join(timeout=timeout)
        from django_debounce.dbconn import thread_tick

        with thread_tick():  # in the stopping thread: a pool may still fork meanwhile
            self.tick(force=True)  # what the last runs recorded
