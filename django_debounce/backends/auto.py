"""The default store: Redis when the configured cache alias is django-redis and answers,
the database otherwise; a Redis failure during a trigger falls back to the database.

Guarantee while Redis is failing (docs/operations.md, "Redis outages and failover";
docs/design.md, "Failover of the auto store"): every trigger is accepted and covered by a run
(at least once, never lost). While both stores hold a flight for one key,
a run from each may overlap.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.conf import settings

from django_debounce import conf, observe
from django_debounce.backends.base import BaseBackend
from django_debounce.backends.database import DatabaseBackend
from django_debounce.state import FireAction

logger = logging.getLogger("django_debounce")

# How long to route triggers to the database after a Redis failure before trying Redis again.
RETRY_AFTER = 2.0


def _redis_errors() -> tuple[type[BaseException], ...]:
    try:
        from redis.exceptions import ConnectionError, TimeoutError
    except ImportError:  # pragma: no cover - redis not installed: auto never picks it
        return ()
    return (ConnectionError, TimeoutError, OSError)


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
        self._redis: Any = None
        self._down_until = 0.0
        self._in_outage = False
        self.errors = _redis_errors()

    @property
    def redis(self) -> Any:
        """The Redis store, or ``None`` when the cache alias is not django-redis."""
        if self._redis is None:
            alias = conf.get("CACHE_ALIAS")
            backend = settings.CACHES.get(alias, {}).get("BACKEND", "")
            if backend.startswith("django_redis.") and self.errors:
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

    def _recovered(self) -> None:
        if self._in_outage:
            self._in_outage = False
            logger.warning("django_debounce: Redis answers again; triggers go to Redis")

    def _store(self, store: str | None) -> BaseBackend:
        if store == "r" and self.redis is not None:
            return self.redis
        return self.database

    # -- operations -----------------------------------------------------------------------

    def trigger(self, **kwargs: Any):
        redis = self._usable()
        if redis is not None:
            try:
                out = redis.trigger(**kwargs)
            except self.errors as exc:
                self._failed(exc)
                observe.fallback(kwargs["task_name"])
            else:
                self._recovered()
                return out
        elif self._in_outage:
            with stats.lock:
                stats.fallbacks += 1
            observe.fallback(kwargs["task_name"])
        return self.database.trigger(**kwargs)

    def abort_trigger(self, key_hash, seq, undo):
        if "last" in undo:  # issued by the Redis store
            return self.redis.abort_trigger(key_hash, seq, undo)
        return self.database.abort_trigger(key_hash, seq, undo)

    def fire(self, key_hash, seq, *, overlap, lease, now=None, store=None, collect_limit=None):
        kw = {"overlap": overlap, "lease": lease, "now": now, "collect_limit": collect_limit}
        if store == "r" and self.redis is not None:
            decision = self.redis.fire(key_hash, seq, **kw)
            if decision.action is not FireAction.MISSING:
                return decision
            # Redis lost the state (restarted empty): run the flight from its durable record.
            return self.database.fire(key_hash, None, **kw)
        if seq is None and self.redis is not None:
            decision = self.redis.fire(key_hash, None, **kw)
            if decision.action is not FireAction.MISSING:
                return decision
        return self.database.fire(key_hash, seq, **kw)

    def finish(self, key_hash, run_id, *, ok, error="", retry_in=None, store=None, now=None):
        return self._store(store).finish(
            key_hash, run_id, ok=ok, error=error, retry_in=retry_in, now=now
        )

    def watch(self, key_hash, at, *, store=None, now=None):
        return self._store(store).watch(key_hash, at, now=now)

    def heartbeat(self, key_hash, run_id, lease, *, store=None, now=None):
        return self._store(store).heartbeat(key_hash, run_id, lease, now=now)

    def flush(self, key_hash, *, now=None):
        redis = self._usable()
        if redis is not None:
            dispatch = redis.flush(key_hash, now=now)
            if dispatch is not None:
                return dispatch
        # The row is the database store's state only when that store owns it; a row mirrored
        # from Redis is a record, not a flight.
        if redis is None or self._database_owns(key_hash):
            return self.database.flush(key_hash, now=now)
        return None

    def cancel(self, key_hash, *, now=None):
        redis = self._usable()
        dropped = redis.cancel(key_hash, now=now) if redis is not None else 0
        if redis is None or self._database_owns(key_hash):
            dropped += self.database.cancel(key_hash, now=now)
        return dropped

    def due_keys(self, now=None, task_names=None):
        redis = self._usable()
        keys = redis.due_keys(now, task_names) if redis is not None else []
        return list(dict.fromkeys(keys + self.database.due_keys(now, task_names)))

    def recover(self, *, grace, adopt=(), now=None):
        redis = self._usable()
        if redis is None:
            return self.database.recover(grace=grace, now=now)
        out: list[Any] = []
        gone: list[str] = []
        try:
            # Triggers that a hung Redis took after their clients had timed out and fell back
            # to the database: the record says "database, idle", Redis still holds them.
            out = redis.recover(grace=grace, now=now, also=redis.held(self._fallen_back()))
            # Flights whose Redis state is gone (Redis restarted empty) run from the record.
            gone = redis.missing(redis.live_hashes())
        except self.errors as exc:
            # Redis failed during recovery: the database store's flights are recovered anyway.
            self._failed(exc)
        return out + self.database.recover(grace=grace, adopt=gone, now=now)

    def _fallen_back(self) -> list[tuple[str, str]]:
        """Idle keys the database store took over, recently enough (twice
        ``DEBOUNCE_REDIS_TTL``) that Redis may still hold state of theirs."""
        from datetime import timedelta

        from django.utils import timezone

        from django_debounce.models import DebounceKey
        from django_debounce.tasks import registered_debounced_tasks

        since = timezone.now() - timedelta(seconds=2 * conf.seconds_of("REDIS_TTL"))
        # Tasks pinned to the database store never have Redis state.
        pinned = [t.name for t in registered_debounced_tasks() if t.debounce_backend == "database"]
        return list(
            DebounceKey.objects.using(self.database.alias)
            .filter(store="database", state=DebounceKey.State.IDLE, updated_at__gte=since)
            .exclude(task_name__in=pinned)
            .values_list("task_name", "key_hash")
        )

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
