"""The default store: Redis when it is configured and answers, the database otherwise; a Redis
failure during a trigger falls back to the database (docs/design.md, "Failover").

Each dispatch message names the store that issued it (``"r"``/``"d"``), and every later step
of that flight goes to the same store. Both stores keep their own due index; the pump takes
from both. Guarantee while Redis is failing (see docs/operations.md, "Redis outages"): every
trigger is accepted and covered by a run (at least once, never lost). While both stores hold
a flight for one key, a run from each may overlap.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.conf import settings

from django_debounce import conf, observe
from django_debounce.backends.base import BaseBackend, Taken, TriggerManyError
from django_debounce.backends.database import DatabaseBackend
from django_debounce.backends.errors import redis_unavailable, unopened
from django_debounce.state import FireAction

logger = logging.getLogger("django_debounce")

# How long to route triggers to the database after a Redis failure before trying Redis again.
RETRY_AFTER = 2.0


def _redis_errors() -> tuple[type[BaseException], ...]:
    """The exception classes a Redis failure can raise (``redis_unavailable`` then says
    whether it is a failure of the store or a bug)."""
    try:
        from redis.exceptions import RedisError
    except ImportError:  # pragma: no cover - redis not installed: auto never picks it
        return ()
    return (RedisError, OSError)


class FallbackStats:
    """Counts of triggers that went to the database because Redis failed (per process)."""

    def __init__(self) -> None:
        self.fallbacks = 0
        self.outages = 0
        self.lock = threading.Lock()


stats = FallbackStats()


class AutoBackend(BaseBackend):
    """``DEBOUNCE_BACKEND='auto'``: the Redis store with the database store behind it."""

    name = "auto"

    def __init__(self) -> None:
        self.database = DatabaseBackend()
        self.database.redis_beside = lambda: self.redis is not None
        self._redis: Any = None
        self._down_until = 0.0
        self._in_outage = False
        self.errors = _redis_errors()

    @property
    def redis(self) -> Any:
        """The Redis store, or ``None`` when no Redis is configured (no ``DEBOUNCE_REDIS_URL``
        or ``DEBOUNCE_REDIS_CLUSTER``, and the cache alias is not django-redis)."""
        if self._redis is None:
            alias = conf.get("CACHE_ALIAS")
            backend = settings.CACHES.get(alias, {}).get("BACKEND", "")
            configured = (
                conf.get("REDIS_URL")
                or conf.get("REDIS_CLUSTER")
                or backend.startswith("django_redis.")
            )
            if configured and self.errors:
                from django_debounce.backends.redis import RedisBackend

                self._redis = RedisBackend()
            else:
                self._redis = False
        return self._redis or None

    def _usable(self) -> Any:
        redis = self.redis
        if redis is None or time.monotonic() < self._down_until:
            return None
        return redis

    def _failed(self, exc: BaseException) -> None:
        self._down_until = time.monotonic() + RETRY_AFTER
        with stats.lock:
            stats.fallbacks += 1
            if not self._in_outage:
                stats.outages += 1
        if not self._in_outage:
            self._in_outage = True
            logger.warning(
                "django_debounce: Redis failed (%s); triggers go to the database until it "
                "answers again",
                exc,
            )

    def _pump_failed(self, exc: BaseException, step: str) -> None:
        """A Redis error in a pump step: the database store's part goes on either way."""
        if redis_unavailable(exc):
            self._failed(exc)
        else:  # a bug: say so loudly, but the database store's flights still move
            logger.error("django_debounce: %s on the Redis store failed", step, exc_info=exc)

    def _recovered(self) -> None:
        if self._in_outage:
            self._in_outage = False
            logger.warning("django_debounce: Redis answers again; triggers go to Redis")

    def _store(self, store: str | None) -> BaseBackend:
        if store == "r" and self.redis is not None:
            return self.redis  # type: ignore[no-any-return]
        return self.database

    # -- triggers ---------------------------------------------------------------------------

    def trigger(self, **kwargs: Any):  # type: ignore[override]
        redis = self._usable()
        unopened_: frozenset[str] = frozenset()
        if redis is not None:
            try:
                out = redis.trigger(**kwargs)
            except self.errors as exc:
                if not redis_unavailable(exc):
                    raise  # a bug (a script error), not a Redis that cannot take the write
                self._failed(exc)
                observe.fallback(kwargs["task_name"])
                unopened_ = unopened(exc)
            else:
                self._recovered()
                return out
        elif self._in_outage:
            with stats.lock:
                stats.fallbacks += 1
            observe.fallback(kwargs["task_name"])
        return self.database.trigger(**kwargs, unopened=unopened_)

    def trigger_many(self, *, task_name, items, options, now=None):
        redis = self._usable()
        if redis is None:
            return self.database.trigger_many(
                task_name=task_name, items=items, options=options, now=now
            )
        try:
            out = redis.trigger_many(task_name=task_name, items=items, options=options, now=now)
        except TriggerManyError as exc:
            failed = sorted(exc.errors)
            for error in exc.errors.values():
                if not redis_unavailable(error):
                    raise error from exc
            self._failed(next(iter(exc.errors.values())))
            out = list(exc.results)
            redone = self.database.trigger_many(
                task_name=task_name,
                items=[items[i] for i in failed],
                options=options,
                now=now,
                unopened=unopened(exc),
            )
            for i, result in zip(failed, redone, strict=True):
                out[i] = result
                observe.fallback(task_name)
            return out
        except self.errors as exc:
            if not redis_unavailable(exc):
                raise
            self._failed(exc)
            observe.fallback(task_name)
            return self.database.trigger_many(
                task_name=task_name, items=items, options=options, now=now
            )
        self._recovered()
        return out

    # -- the pump ---------------------------------------------------------------------------

    def peek(self, task_names, *, now=None):
        times = [self.database.peek(task_names, now=now)]
        redis = self._usable()
        if redis is not None:
            try:
                times.append(redis.peek(task_names, now=now))
            except self.errors as exc:
                self._pump_failed(exc, "peek")
        known = [t for t in times if t is not None]
        return min(known) if known else None

    def take(self, tasks, limit, *, now=None):
        out = Taken()
        redis = self._usable()
        if redis is not None:
            try:
                out = redis.take(tasks, limit, now=now)
            except self.errors as exc:
                self._pump_failed(exc, "take")
        db = self.database.take(tasks, max(limit - len(out.dispatches), 0), now=now)
        nexts = [t for t in (out.next_in, db.next_in) if t is not None]
        return Taken(
            out.dispatches + db.dispatches,
            out.again + db.again,
            min(nexts) if nexts else None,
        )

    def release(self, dispatches, *, now=None):
        redis = [d for d in dispatches if d.store == "r"]
        if redis and self.redis is not None:
            self.redis.release(redis, now=now)
        database = [d for d in dispatches if d.store != "r"]
        if database:
            self.database.release(database, now=now)

    def recheck(self, *, limit: int = 500, now: Any = None) -> int:
        """``RedisBackend.recheck`` when Redis answers (flights whose Redis state was lost are
        rebuilt in Redis from their durable record)."""
        redis = self._usable()
        if redis is None:
            return 0
        try:
            return int(redis.recheck(limit=limit, now=now))
        except self.errors as exc:
            self._pump_failed(exc, "recheck")
            return 0

    # -- the worker -------------------------------------------------------------------------

    def fire(self, key_hash, seq, *, task_name, options, now=None, store=None):
        if store is None and seq is None:
            # In-process (run_due): no message names the store. A flight Redis holds runs
            # through Redis: a row the Redis store mirrors is a record, not a flight, and
            # the database store would run it a second time from there.
            redis = self._usable()
            if redis is not None:
                decision = redis.fire(key_hash, seq, task_name=task_name, options=options, now=now)
                if decision.action is FireAction.CLAIM or not self._database_owns(key_hash):
                    return decision  # type: ignore[no-any-return]
        return self._store(store).fire(key_hash, seq, task_name=task_name, options=options, now=now)

    def finish(self, key_hash, run_id, end, *, task_name, options, now=None, store=None):
        return self._store(store).finish(
            key_hash, run_id, end, task_name=task_name, options=options, now=now
        )

    def heartbeat(self, key_hash, run_id, lease, *, task_name, options, now=None, store=None):
        return self._store(store).heartbeat(
            key_hash, run_id, lease, task_name=task_name, options=options, now=now
        )

    def extend(self, runs, *, now=None):
        out: list[float | None] = [None] * len(runs)
        for code in ("r", "d"):
            picked = [i for i, run in enumerate(runs) if (run.store == "r") == (code == "r")]
            if not picked:
                continue
            got = self._store(code).extend([runs[i] for i in picked], now=now)
            for i, value in zip(picked, got, strict=True):
                out[i] = value
        return out

    # -- operators --------------------------------------------------------------------------

    def flush(self, key_hash, *, task_name, options, now=None):
        redis = self._usable()
        if redis is not None:
            try:
                dispatch = redis.flush(key_hash, task_name=task_name, options=options, now=now)
            except self.errors as exc:
                if not redis_unavailable(exc):
                    raise
                self._failed(exc)
                redis, dispatch = None, None
            if dispatch is not None:
                return dispatch
        # The row is the database store's state only when that store owns it; a row mirrored
        # from Redis is a record, not a flight.
        if redis is None or self._database_owns(key_hash):
            return self.database.flush(key_hash, task_name=task_name, options=options, now=now)
        return None

    def cancel(self, key_hash, *, task_name, options, now=None):
        redis = self._usable()
        dropped = 0
        if redis is not None:
            try:
                dropped = redis.cancel(key_hash, task_name=task_name, options=options, now=now)
            except self.errors as exc:
                if not redis_unavailable(exc):
                    raise
                self._failed(exc)
                redis = None
        if redis is None or self._database_owns(key_hash):
            dropped += self.database.cancel(key_hash, task_name=task_name, options=options, now=now)
        return dropped

    def due_keys(self, now=None, task_names=None):
        redis = self._usable()
        keys = redis.due_keys(now, task_names) if redis is not None else []
        return list(dict.fromkeys(keys + self.database.due_keys(now, task_names)))

    # -- reading ----------------------------------------------------------------------------

    def live_state(self, key_hash):
        redis = self._usable()
        row = self.database.live_state(key_hash)
        if redis is not None and (row is None or not self._database_owns(key_hash)):
            live = redis.live_state(key_hash)
            if live is not None:
                return live
        return row

    def _database_owns(self, key_hash: str) -> bool:
        from django_debounce.models import DebounceKey

        return (
            DebounceKey.objects.using(self.database.alias)
            .filter(key_hash=key_hash, store="database")
            .exists()
        )

    def live_rows(self, key_hashes):
        redis = self._usable()
        if redis is None:
            return {}
        try:
            return redis.live_rows(key_hashes)  # type: ignore[no-any-return]
        except self.errors:
            return {}

    def pending_counts(self, key_hashes):
        counts = self.database.pending_counts(key_hashes)
        redis = self._usable()
        if redis is not None:
            try:
                live = redis.pending_counts(key_hashes)
            except self.errors:
                return counts
            from django_debounce.models import DebounceKey

            in_redis = set(
                DebounceKey.objects.using(self.database.alias)
                .filter(key_hash__in=key_hashes, store="redis")
                .values_list("key_hash", flat=True)
            )
            counts.update({h: n for h, n in live.items() if h in in_redis})
        return counts

    def index_stats(self, task_names=None):
        out = dict(self.database.index_stats(task_names))
        redis = self._usable()
        if redis is not None:
            from django_debounce.state import IndexStats

            for name, got in redis.index_stats(task_names).items():
                mine = out.get(name)
                if mine is None:
                    out[name] = got
                else:
                    out[name] = IndexStats(
                        mine.depth + got.depth,
                        mine.due + got.due,
                        max(mine.oldest_due_age, got.oldest_due_age),
                    )
        return out
