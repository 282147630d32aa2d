"""The Redis store: the database store's rows decide every key's lifecycle, and a Redis
counter per key absorbs the triggers that change nothing but the open flight's count and
last trigger time (docs/design.md, "One record per key" and "The counter and its fences").

Redis may forget any key at any moment: a forgotten counter loses only what it counted (the
admin's merged total, and a debounce window that may end early), never a trigger's run.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import time
from collections.abc import Sequence
from functools import cached_property
from importlib import resources
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from django_debounce import conf
from django_debounce.backends.database import DatabaseBackend
from django_debounce.backends.rows import Record, Rows, to_us
from django_debounce.exceptions import StoreUnavailable
from django_debounce.machine import US
from django_debounce.models import DebounceKey
from django_debounce.state import Dispatch, FlightOptions, TriggerResult

logger = logging.getLogger("django_debounce")

# Seconds a counter outlives its flight's due time, in pump intervals: the pump seals it
# at the due time; a claim that cannot reach Redis waits this much longer (fence 4).
GRACE_INTERVALS = 3


def key_id(key_hash: str) -> str:
    """A key's id in Redis: its SHA-256 (64 hex digits) in unpadded base64url, 43 characters."""
    return base64.urlsafe_b64encode(bytes.fromhex(key_hash)).rstrip(b"=").decode()


def fingerprint(payload_json: str, options: FlightOptions) -> str:
    """What a trigger must share with the counter's to merge there: its payload and the
    options of its due time (a per-call ``debounce_wait``/``debounce_max_wait`` included)."""
    digest = hashlib.blake2b(payload_json.encode(), digest_size=9).digest()
    max_wait = "" if options.max_wait is None else int(round(options.max_wait * US))
    text = base64.b64encode(digest).decode()
    return f"{int(round(options.wait * US))}:{max_wait}:{text}"


def options_of(fp: str | bytes) -> tuple[int, int | None]:
    """The ``wait`` and ``max_wait`` (microseconds) a counter's fingerprint names."""
    text = fp.decode() if isinstance(fp, bytes) else fp
    wait, max_wait, _digest = text.split(":", 2)
    return int(wait), (int(max_wait) if max_wait else None)


def redis_errors() -> tuple[type[BaseException], ...]:
    """What a Redis call may raise when Redis cannot take it (any error reply included: the
    row path is always safe; a cluster's errors, one that cannot be reached among them)."""
    from redis.exceptions import RedisClusterException, RedisError

    return (RedisError, RedisClusterException, OSError)


_free_marks: dict[int, list[list[Any]]] = {}  # by process: the merge marks no call holds


def take_mark() -> list[Any]:
    """A merge mark ``[field, number of its last merge]`` that no other call holds (merge.lua;
    ``_merges`` gives it back). A forked child makes marks of its own."""
    free = _free_marks.setdefault(os.getpid(), [])
    return free.pop() if free else ["m" + base64.b64encode(os.urandom(9)).decode(), 0]


class RedisBackend(DatabaseBackend):
    """Counters in Redis over the database store's rows (``DEBOUNCE_BACKEND = "redis"``)."""

    name = "redis"

    @cached_property
    def client(self) -> Any:
        """The redis-py client: ``DEBOUNCE_REDIS_CLUSTER`` (a ``RedisCluster``),
        ``DEBOUNCE_REDIS_URL``, else the django-redis cache ``DEBOUNCE_CACHE_ALIAS``.

        Raises ``ImproperlyConfigured`` when none of them gives a client.
        """
        cluster = conf.get("REDIS_CLUSTER")
        if cluster:
            from redis.cluster import ClusterNode, RedisCluster

            if isinstance(cluster, str):
                return RedisCluster.from_url(cluster)
            nodes = []
            for node in cluster:
                host, _, port = str(node).rpartition(":")
                nodes.append(ClusterNode(host or "127.0.0.1", int(port)))
            return RedisCluster(startup_nodes=nodes)
        url = conf.get("REDIS_URL")
        if url:
            import redis

            return redis.Redis.from_url(url)
        alias = conf.get("CACHE_ALIAS")
        if not redis_configured():
            backend = settings.CACHES.get(alias, {}).get("BACKEND", "")
            raise ImproperlyConfigured(
                f"DEBOUNCE_BACKEND='redis' needs DEBOUNCE_REDIS_URL, DEBOUNCE_REDIS_CLUSTER, or "
                f"DEBOUNCE_CACHE_ALIAS={alias!r} to be a django-redis cache "
                f"(django_redis.cache.RedisCache), not {backend!r}. Configure one, or use "
                "DEBOUNCE_BACKEND='database'."
            )
        from django_redis import get_redis_connection

        return get_redis_connection(alias)

    @cached_property
    def prefix(self) -> str:
        """The prefix of every Redis key of this store (``DEBOUNCE_REDIS_PREFIX``)."""
        value = conf.get("REDIS_PREFIX")
        if not isinstance(value, str) or not value or "{" in value or "}" in value:
            raise ImproperlyConfigured(
                f"DEBOUNCE_REDIS_PREFIX must be a non-empty str without braces, got {value!r}."
            )
        return value

    def counter_key(self, key_hash: str) -> str:
        """The Redis key of ``key_hash``'s counter."""
        return f"{self.prefix}:{key_id(key_hash)}"

    @cached_property
    def scripts(self) -> dict[str, Any]:
        """The three scripts, registered once (called by SHA, loaded again on NOSCRIPT)."""
        lua = resources.files("django_debounce.backends") / "lua"
        return {
            name: self.client.register_script((lua / f"{name}.lua").read_text())
            for name in ("merge", "open", "seal")
        }

    def grace(self) -> int:
        """Microseconds a counter outlives its flight's due time."""
        return int(round(GRACE_INTERVALS * conf.seconds_of("PUMP_INTERVAL") * US))

    # Seconds a failure of Redis sends triggers straight to the row path (no merge tried, no
    # counter made): a Redis that hangs costs one trigger's timeouts a second, not every one's.
    BACKOFF = 1.0
    pipelines_scripts = True  # False: the client cannot pipeline scripts (an old cluster client)
    _skip_until = 0.0
    _warned_at = -3600.0

    def _failed(self, what: str, exc: BaseException) -> None:
        """Redis failed a call: back off, and warn once a minute at most."""
        now = time.monotonic()
        self._skip_until = now + self.BACKOFF
        if now - self._warned_at >= 60.0:
            self._warned_at = now
            logger.warning("django_debounce: Redis failed a %s (%s); the rows take it", what, exc)
        else:
            logger.debug("django_debounce: Redis failed a %s (%s)", what, exc)

    def _calls(self, name: str, calls: Sequence[tuple[str, list[Any]]]) -> list[Any]:
        """Run script ``name`` for each ``(Redis key, args)``, pipelined; each reply, or the
        error of that call. A script Redis lost (a restart) is loaded again."""
        from redis.exceptions import NoScriptError, RedisClusterException

        if len(calls) == 1 or not self.pipelines_scripts:
            out: list[Any] = []
            for key, args in calls:
                try:  # EVALSHA itself: redis-py's Script call measured 6-13 us slower
                    try:  # (the client is made on first use: a cluster connects then)
                        out.append(self.client.evalsha(self.scripts[name].sha, 1, key, *args))
                    except NoScriptError:  # Redis lost it (a restart): Script loads it again
                        out.append(self.scripts[name](keys=[key], args=args))
                except redis_errors() as exc:
                    self._failed(name, exc)
                    out.append(exc)
            return out
        try:
            script, pipe = self.scripts[name], self.client.pipeline(transaction=False)
            try:
                for key, args in calls:
                    script(keys=[key], args=args, client=pipe)
            except RedisClusterException:  # redis-py before 6 refuses scripts in its pipeline
                self.pipelines_scripts = False
                return self._calls(name, calls)
            replies = list(pipe.execute(raise_on_error=False))
        except redis_errors() as exc:
            self._failed(name, exc)
            return [exc] * len(calls)

        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):  # a cluster pipeline leaves it to us
                replies[i] = self._calls(name, [calls[i]])[0]
        return replies

    def backing_off(self) -> bool:
        """Whether Redis failed less than ``BACKOFF`` seconds ago in this process."""
        return time.monotonic() < self._skip_until

    # -- triggers ------------------------------------------------------------------------------

    def _merges(
        self, items: Sequence[tuple[str, str]], now: Any
    ) -> list[tuple[int, int, int, int] | None]:
        """Run **merge** for each ``(key_hash, fingerprint)`` in one pipeline, each a number of
        one mark; a call whose reply was lost (a timeout or a dropped connection) is sent once
        more (fence 6). ``None`` for an item Redis did not answer (and for every item while
        backing off)."""
        if self.backing_off():
            return [None] * len(items)
        at = "" if now is None else str(to_us(now))
        mark, calls = take_mark(), []
        for hashed, fp in items:
            mark[1] += 1
            calls.append((self.counter_key(hashed), [fp, at, mark[0], mark[1]]))
        replies = self._calls("merge", calls)
        lost: list[int] = []
        if any(isinstance(r, Exception) for r in replies):
            from redis import exceptions as rx

            dropped = (rx.ConnectionError, rx.TimeoutError)  # not their subclasses: never ran
            lost = [i for i, r in enumerate(replies) if type(r) in dropped]
        if lost:
            for i, reply in zip(lost, self._calls("merge", [calls[i] for i in lost]), strict=True):
                replies[i] = reply
        _free_marks.setdefault(os.getpid(), []).append(mark)
        return [None if isinstance(r, Exception) else tuple(r) for r in replies]

    def trigger(self, *, task_name, key, key_hash, payload_json, options, now=None):
        fp = fingerprint(payload_json, options)
        seen: dict[str, int] = {}
        if options.collect_limit is None:
            reply = self._merges([(key_hash, fp)], now)[0]
            if reply is not None and reply[0] == 1:
                return TriggerResult(key, reply[1], reply[2], None, False), None
            if reply is not None:
                seen[key_hash] = reply[3]
        context = (seen, {key_hash: fp})
        return self.row_trigger(task_name, key, key_hash, payload_json, options, now, context)

    def trigger_many(self, *, task_name, items, options, now=None):
        out: list[tuple[TriggerResult, Dispatch | None] | None] = [None] * len(items)
        fps = [fingerprint(payload, options) for _k, _h, payload in items]
        # a key whose triggers in this batch differ takes the row path for all of them, so
        # they keep their order
        shapes: dict[str, set[str]] = {}
        for (_key, hashed, _p), fp in zip(items, fps, strict=True):
            shapes.setdefault(hashed, set()).add(fp)
        asked = [
            i
            for i, (_key, hashed, _p) in enumerate(items)
            if options.collect_limit is None and len(shapes[hashed]) == 1
        ]
        if len(asked) > 1 and not self.backing_off():
            # step 1: only keys whose row has a flight or a counter ask Redis
            hashes, have = list({items[i][1] for i in asked}), set()
            live = DebounceKey.objects.using(self.alias).exclude(pending=0, counter_until=None)
            for start in range(0, len(hashes), self.MANY):
                got = live.filter(key_hash__in=hashes[start : start + self.MANY])
                have.update(got.values_list("key_hash", flat=True))
            asked = [i for i in asked if items[i][1] in have]
        replies = self._merges([(items[i][1], fps[i]) for i in asked], now) if asked else []
        seen: dict[str, int] = {}  # key hash -> Redis time of its merge attempt
        rest: list[int] = []
        answered = dict(zip(asked, replies, strict=True))
        for i, (key, hashed, _payload) in enumerate(items):
            reply = answered.get(i)
            if reply is not None and reply[0] == 1:
                _hit, flight_id, pending, _at = reply
                out[i] = (TriggerResult(key, flight_id, pending, None, False), None)
                continue
            if reply is not None:
                seen[hashed] = reply[3]
            rest.append(i)
        if rest:
            context = (seen, {items[i][1]: fps[i] for i in rest})
            done = self.row_triggers(task_name, [items[i] for i in rest], options, now, context)
            for i, result in zip(rest, done, strict=True):
                out[i] = result
        return out  # type: ignore[return-value]

    def opened(self, rows: Rows, records: Sequence[Record], now: int, context: Any) -> None:
        """Before the row path commits: the fence of the counter a flight gets at its
        second trigger (fence 2: its id and ``counter_until`` in the row first).
        ``context``: the Redis time of each key's merge attempt, and the fingerprint of its
        last trigger."""
        if context is None:
            return
        seen, fps = context
        for record in records:
            k = record.key
            t_r = seen.get(record.key_hash)
            # a flight's first trigger makes no counter: most flights of an import or a
            # lone save never get a second one, and their claim then seals nothing
            if t_r is None or k.pending < 2 or k.cfg.collect or k.due is None:
                continue
            until = k.due + self.grace()
            if record.counter_until is not None:
                until = max(until, record.counter_until)  # an older counter it could not seal
            record.counter_id = max(record.counter_id + 1, now)
            record.counter_until = until
            # the counter dies in Redis's clock no later than `until` in the database's: only
            # the duration crosses, counted from Redis's time taken before the row was read
            x = t_r + (until - now)
            if k.running_until is not None:
                # a lost run is recovered on the row path before a trigger joins its flight
                x = min(x, t_r + (k.running_until - now))
            record.extra["open"] = (
                record.counter_id,
                fps[record.key_hash],
                x,
                k.flight_id,
                k.pending,
                "" if rows.now_given is None else str(now),  # a caller's clock, as merge had
            )

    def after_commit(self, records: Sequence[Record]) -> None:
        """After the row path committed: make the counters its flights got (fence 1)."""
        todo = [(r.key_hash, r.extra.pop("open")) for r in records if "open" in r.extra]
        if not todo or self.backing_off():
            return
        calls = [(self.counter_key(h), list(opening)) for h, opening in todo]
        # in a caller's transaction (`on_commit=False`): at its commit; a rollback makes none
        transaction.on_commit(lambda: self._calls("open", calls), using=self.alias)

    # -- the fence of every other step ---------------------------------------------------------

    def settle(self, rows, records, now, *, mode="claim"):
        """Seal the counter each record names and fold what it counted into the record
        (fences 3 and 4). A counter that cannot be sealed: a trigger goes on; a claim waits
        for ``counter_until`` (the flight's due time moves there); a cancel raises
        ``StoreUnavailable``; past ``counter_until`` the counter is dead and every step goes
        on."""
        todo = [r for r in records if r.counter_until is not None]
        if not todo:
            return
        at = "" if rows.now_given is None else str(rows.now_given)
        # a count kept for a step that fails to commit waits for its retry: the pump takes a
        # flight whose message did not claim it again after DISPATCH_GRACE
        keep = rows.retake + self.grace()
        calls = [
            (self.counter_key(r.key_hash), [r.counter_id, max(r.counter_until - now, 0), at, keep])  # type: ignore[operator]
            for r in todo
        ]
        replies = self._calls("seal", calls)
        # Redis's time of the seal is at most this much after the step's time: the last
        # counted trigger's time in the database's clock is never taken earlier than it was
        elapsed = 0 if rows.now_given is not None else int((time.monotonic() - rows.read_at) * US)
        for record, reply in zip(todo, replies, strict=True):
            k = record.key
            until = record.counter_until
            assert until is not None
            if isinstance(reply, Exception):
                if now >= until:
                    record.counter_until = None  # dead in Redis by now (fence 2)
                elif mode == "cancel":
                    raise StoreUnavailable(
                        "Redis cannot be reached to seal the counter of this key's flight, "
                        f"which may count triggers until {until} us: cancel again later."
                    )
                elif mode == "claim" and k.pending and k.due is not None:
                    k.due = max(k.due, until)
                continue
            record.counter_until = None
            count = int(reply[0])
            if count > 0 and k.pending:
                k.fold(count, now + elapsed - int(reply[1]), *options_of(reply[2]))
            elif count > 0:
                logger.error(
                    "django_debounce: a counter of %s counted %d triggers of no open flight",
                    record.key_hash,
                    count,
                )

    # -- reading -------------------------------------------------------------------------------

    def counted(self, key_hashes: Sequence[str]) -> dict[str, int]:
        """Triggers the counters of ``key_hashes`` absorbed and no step folded yet (derived:
        may lag, and is empty when Redis cannot be reached)."""
        try:
            pipe = self.client.pipeline(transaction=False)
            for hashed in key_hashes:
                pipe.hmget(self.counter_key(hashed), "n", "s")
            replies = pipe.execute()
        except redis_errors():
            return {}
        return {
            h: int(n)
            for h, (n, sealed) in zip(key_hashes, replies, strict=True)
            if n and not sealed and int(n) > 0
        }

    def live_rows(self, key_hashes):
        rows = super().live_rows(key_hashes)
        for hashed, n in self.counted(list(rows)).items():
            row = rows[hashed]
            if row["pending"]:
                row["pending"] += n
                row["triggers"] += n
        return rows


def redis_configured() -> bool:
    """Whether a Redis for the Redis store is configured: ``DEBOUNCE_REDIS_URL``,
    ``DEBOUNCE_REDIS_CLUSTER``, or a django-redis cache at ``DEBOUNCE_CACHE_ALIAS``."""
    if conf.get("REDIS_URL") or conf.get("REDIS_CLUSTER"):
        return True
    cache = settings.CACHES.get(conf.get("CACHE_ALIAS"), {})
    return str(cache.get("BACKEND", "")).startswith("django_redis.")


__all__ = ["RedisBackend", "StoreUnavailable", "fingerprint", "key_id", "redis_configured"]
