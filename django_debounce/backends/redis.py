"""The Redis store: one Lua script per operation, one round trip per trigger.

State of a key is one hash, ``debounce:{<key hash>}``: the braces make it a Redis Cluster
hash tag, so every key a script touches is in one slot. Times come from Redis ``TIME`` (in
integer microseconds); every write refreshes a TTL (``DEBOUNCE_REDIS_TTL``, and never less
than the state still needs), so no counter is immortal, even after a crash between steps.

The database keeps the durable record the admin reads: the ``DebounceKey`` row is written
on flight transitions only (flight opened, run claimed, run finished, cancel, recovery),
never per merged trigger; ``DebounceRun`` rows are written at claim and finish.
The connection is that of a django-redis cache alias (``DEBOUNCE_CACHE_ALIAS``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import datetime
from datetime import timezone as dt_timezone
from functools import cached_property
from importlib import resources
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, router, transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from django_debounce import conf
from django_debounce.backends.base import BaseBackend
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.state import Claim, Dispatch, FireAction, FireDecision, TriggerResult

logger = logging.getLogger("django_debounce")

US = 1_000_000
OPERATIONS = (
    "trigger",
    "abort",
    "fire",
    "finish",
    "heartbeat",
    "flush",
    "cancel",
    "recover",
    "watch",
)


# Record fields that count up: a snapshot never lowers them (see ``_write_record``).
MONOTONIC_FIELDS = (
    "run_id",
    "flight_id",
    "scheduled_seq",
    "triggers",
    "runs",
    "merged",
    "cancelled",
)


def _dt(us: int | str | bytes) -> datetime | None:
    us = int(us)
    if us <= 0:
        return None
    return datetime.fromtimestamp(us / US, tz=dt_timezone.utc)


def _us(value: datetime) -> int:
    return int(round(value.timestamp() * US))


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def redis_key(key_hash: str) -> str:
    """The Redis key holding the state of ``key_hash`` (hash-tagged for Redis Cluster)."""
    return f"debounce:{{{key_hash}}}"


def redis_keys(key_hash: str) -> list[str]:
    """Every Redis key of ``key_hash``: the state hash, then the sorted sets of collected
    items (pending, and claimed by the live run). One hash slot."""
    base = redis_key(key_hash)
    return [base, base + ":c", base + ":r"]


def _pack(parts: list[bytes]) -> bytes:
    """RESP bulk strings of ``parts``, without the array header."""
    return b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def _now(now: datetime | None) -> int:
    """ARGV[1] of every script: the time override in microseconds, 0 for Redis ``TIME``."""
    return _us(now) if now is not None else 0


class RedisBackend(BaseBackend):
    """Lua-scripted store on the connection of a django-redis cache alias."""

    name = "redis"
    store = "r"

    @cached_property
    def client(self) -> Any:
        """The redis-py client of the django-redis cache ``DEBOUNCE_CACHE_ALIAS``.

        Raises ``ImproperlyConfigured`` when that cache is not a django-redis cache.
        """
        alias = conf.get("CACHE_ALIAS")
        backend = settings.CACHES.get(alias, {}).get("BACKEND", "")
        if not backend.startswith("django_redis."):
            raise ImproperlyConfigured(
                f"DEBOUNCE_BACKEND='redis' needs DEBOUNCE_CACHE_ALIAS={alias!r} to be a "
                f"django-redis cache (django_redis.cache.RedisCache), not {backend!r}. "
                "Configure one, or use DEBOUNCE_BACKEND='auto' or 'database'."
            )
        from django_redis import get_redis_connection

        return get_redis_connection(alias)

    @cached_property
    def scripts(self) -> dict[str, Any]:
        """Scripts are registered once; redis-py calls them by SHA and reloads on NOSCRIPT."""
        lua = resources.files("django_debounce.backends") / "lua"
        common = (lua / "common.lua").read_text()
        scripts = {}
        for op in OPERATIONS:
            source = (lua / f"{op}.lua").read_text()
            # trigger.lua places the shared functions after its hot path, so a merged trigger
            # does not pay for defining them.
            source = (
                source.replace("-- @@common@@", common)
                if "-- @@common@@" in source
                else common + "\n" + source
            )
            scripts[op] = self.client.register_script(source)
        return scripts

    @cached_property
    def _direct(self) -> threading.local | None:
        """Per-thread state of the direct trigger path, or ``None`` when the client is not a
        plain ``redis.Redis`` on a ``ConnectionPool`` (Sentinel, Cluster: the normal path)."""
        import redis

        client = self.client
        pool = getattr(client, "connection_pool", None)
        if type(client) is not redis.Redis or type(pool) not in (
            redis.ConnectionPool,
            redis.BlockingConnectionPool,
        ):
            return None
        self._tails: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}
        return threading.local()

    def _send_direct(self, packed: bytes) -> Any:
        """Send one packed command on a connection this thread keeps for the trigger hot path
        and read its reply: the hot path skips redis-py's per-command machinery (pool
        checkout, retries, observability), which costs more than the script itself. The
        connection is made with the pool's own settings (host, TLS, timeouts) and made again
        after a fork. Errors are those of the normal path (``ConnectionError``,
        ``TimeoutError``, ``ResponseError`` such as ``NoScriptError``); the connection is
        dropped on a connection error."""
        local = self._direct
        assert local is not None
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            pool = self.client.connection_pool
            conn = local.conn = pool.connection_class(**pool.connection_kwargs)
            local.pid = os.getpid()
        try:
            conn.send_packed_command([packed], check_health=False)
            return conn.read_response()
        except (RedisConnectionError, RedisTimeoutError, OSError):
            conn.disconnect()
            raise

    def _trigger_hot(self, rkey: str, payload: str, tail: tuple[Any, ...]) -> Any:
        """``EVALSHA trigger 1 rkey 0 payload *tail`` through ``_send_direct``; the constant
        head and tail of the command are packed once per task configuration."""
        packed = self._tails.get(tail)
        if packed is None:
            sha = self.scripts["trigger"].sha.encode()
            packed = self._tails[tail] = (
                b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n1\r\n" % (6 + len(tail), sha),
                _pack([str(a).encode() for a in tail]),
            )
        head, packed_tail = packed
        k = rkey.encode()
        p = payload.encode()
        return self._send_direct(
            b"".join(
                (
                    head,
                    b"$%d\r\n" % len(k),
                    k,
                    b"\r\n$1\r\n0\r\n$%d\r\n" % len(p),
                    p,
                    b"\r\n",
                    packed_tail,
                )
            )
        )

    def _run(self, op: str, keys: str | list[str], args: list[Any]) -> Any:
        """EVALSHA of script ``op`` on one key (``keys`` a str) or the keys of one debounce key;
        loads it again after NOSCRIPT (a restarted or flushed server). One round trip in the
        normal case."""
        script = self.scripts[op]
        if isinstance(keys, str):
            keys = [keys]
        try:
            return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            script.sha = self.client.script_load(script.script)
            return self.client.evalsha(script.sha, len(keys), *keys, *args)

    @property
    def alias(self) -> str:
        return router.db_for_write(DebounceKey)

    def _limits(self) -> tuple[int, int]:
        """Grace (us) and minimum TTL (ms). Read once per backend instance: the instance is
        rebuilt when a ``DEBOUNCE_`` setting changes."""
        limits = self.__dict__.get("_limits_cache")
        if limits is None:
            grace = conf.seconds_of("DISPATCH_GRACE")
            ttl = conf.seconds(conf.get("REDIS_TTL"), name="DEBOUNCE_REDIS_TTL")
            limits = self.__dict__["_limits_cache"] = (int(grace * US), int(ttl * 1000))  # type: ignore[operator]
        return limits

    # -- durable record -------------------------------------------------------------------

    def _record(self, key_hash: str, snap: list[Any], *, lost_run: int = 0) -> None:
        """Mirror a Redis snapshot into the ``DebounceKey`` row (skipped while the database
        store holds a live flight of this key after a Redis outage).

        Best effort: Redis has already committed the step, so a database error here is logged
        and the caller goes on (publishes its message, runs its body); the next transition
        writes the record again.
        """
        if not snap:
            return
        try:
            self._write_record(key_hash, snap, lost_run)
        except DatabaseError:
            logger.exception("django_debounce: could not mirror key %s to the database", key_hash)

    def _write_record(self, key_hash: str, snap: list[Any], lost_run: int) -> None:
        raw = {_s(snap[i]): _s(snap[i + 1]) for i in range(0, len(snap), 2)}
        num = {
            name: int(raw.get(name) or 0)
            for name in (
                "p",
                "f",
                "ft",
                "lt",
                "d",
                "q",
                "sc",
                "sa",
                "r",
                "ru",
                "rt",
                "rf",
                "T",
                "R",
                "M",
                "C",
                "lr",
                "df",
                "ra",
                "nb",
                "rr",
                "an",
            )
        }
        fields = {
            "store": "redis",
            "updated_at": timezone.now(),
            "merge_until": None,  # the database store's hot path must not touch this row
            "state": (
                DebounceKey.State.RUNNING
                if num["ru"]
                else DebounceKey.State.PENDING
                if num["p"]
                else DebounceKey.State.IDLE
            ),
            "pending": num["p"],
            "flight_id": num["f"],
            "first_trigger_at": _dt(num["ft"]),
            "last_trigger_at": _dt(num["lt"]),
            "due_at": _dt(num["d"]),
            "anchor_at": _dt(num["an"]),
            "payload": json.loads(raw["pl"]) if raw.get("pl") else None,
            "scheduled_seq": num["q"],
            "scheduled": bool(num["sc"]),
            "scheduled_at": _dt(num["sa"]),
            "run_id": num["r"],
            "running_until": _dt(num["ru"]),
            "run_triggers": num["rt"],
            "run_payload": json.loads(raw["rp"]) if raw.get("rp") else None,
            "run_first_trigger_at": _dt(num["rf"]),
            "run_attempt": num["rr"],
            "due_fixed": bool(num["df"]),
            "attempt": num["ra"],
            "not_before": _dt(num["nb"]),
            "triggers": num["T"],
            "runs": num["R"],
            "merged": num["M"],
            "cancelled": num["C"],
            "last_run_at": _dt(num["lr"]),
            "last_outcome": raw.get("lo", ""),
        }
        rows = (
            DebounceKey.objects.using(self.alias)
            .filter(key_hash=key_hash)
            .exclude(
                store="database", state__in=[DebounceKey.State.PENDING, DebounceKey.State.RUNNING]
            )
        )
        # Counters never go back: while Redis was failing the database store may have run
        # and counted this key further than the Redis state it kept (a hung Redis), and the
        # database store continues from the record (run ids are unique per store).
        monotonic = {name: Greatest(F(name), Value(fields[name])) for name in MONOTONIC_FIELDS}
        if not rows.update(**{**fields, **monotonic}):
            DebounceKey.objects.using(self.alias).bulk_create(
                [
                    DebounceKey(
                        key_hash=key_hash,
                        key=raw.get("k", ""),
                        task_name=raw.get("tn", ""),
                        **fields,
                    )
                ],
                ignore_conflicts=True,
            )
        if lost_run:
            self._mark_lost(key_hash, lost_run)

    def _seed(self, key_hash: str) -> str:
        row = (
            DebounceKey.objects.using(self.alias)
            .filter(key_hash=key_hash)
            .values_list("run_id", "flight_id", "triggers", "runs", "merged", "cancelled")
            .first()
        )
        return ",".join(str(v) for v in (row or (0, 0, 0, 0, 0, 0)))

    def _mark_lost(self, key_hash: str, run_id: int) -> None:
        DebounceRun.objects.using(self.alias).filter(
            debounce_key__key_hash=key_hash,
            store="redis",
            run_id=run_id,
            outcome=DebounceRun.Outcome.RUNNING,
        ).update(
            outcome=DebounceRun.Outcome.LOST, finished_at=timezone.now(), error="lease ran out"
        )

    # -- operations -----------------------------------------------------------------------

    def trigger(
        self,
        *,
        task_name,
        key,
        key_hash,
        payload,
        wait,
        max_wait,
        overlap=False,
        payload_json=None,
        leading=False,
        trailing=True,
        collect_limit=None,
        now=None,
    ):
        grace, ttl = self._limits()
        encoded = (
            payload_json
            if payload_json is not None
            else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        )
        args = [
            _now(now),
            encoded,
            int(wait * US),
            -1 if max_wait is None else int(max_wait * US),
            grace,
            ttl,
            int(overlap),
            (2 if not trailing else 1) if leading else 0,
            collect_limit or 0,
        ]
        keys: str | list[str] = redis_keys(key_hash) if collect_limit else redis_key(key_hash)
        out = None
        if now is None and not collect_limit and self._direct is not None:
            try:
                out = self._trigger_hot(keys, encoded, tuple(args[2:]))  # type: ignore[arg-type]
            except NoScriptError:
                out = None  # the normal path loads the script again
        if out is None:
            out = self._run("trigger", keys, args)
        if not isinstance(out, (bytes, str)) and len(out) == 1:
            # new to Redis: continue the durable record's counters (another process may open
            # the flight meanwhile, so the second call can merge)
            args += [key, task_name, int(time.time() * US), self._seed(key_hash)]
            out = self._run("trigger", keys, args)
        if isinstance(out, (bytes, str)):  # merged: "flight pending due", nothing to publish
            flight, pending, due = out.split()
            return TriggerResult(key, int(flight), int(pending), _dt(due), False), None, None
        (
            flight_id,
            pending,
            due,
            seq,
            countdown,
            opened,
            prev_pl,
            prev_lt,
            prev_d,
            _now_us,
            lost,
            snap,
            kind,
            prev_df,
            added,
        ) = out
        if snap:
            self._record(key_hash, snap, lost_run=int(lost))
        seq = int(seq)
        kind = _s(kind)
        dispatch = Dispatch(key_hash, seq, int(countdown) / US, self.store, kind) if seq else None
        result = TriggerResult(
            key=key,
            flight_id=int(flight_id),
            pending=int(pending),
            due_at=_dt(due),
            scheduled=kind == "fire",
            dropped=int(pending) == 0,
        )
        undo = {
            "at": int(_now_us),
            "opened": int(opened),
            "payload": _s(prev_pl),
            "last": int(prev_lt),
            "due": int(prev_d),
            "due_fixed": int(prev_df),
            "added": int(added),
            "item": encoded,
            "pending": int(pending),
            "flight": int(flight_id),
        }
        return result, dispatch, undo

    def abort_trigger(self, key_hash, seq, undo):
        grace, ttl = self._limits()
        out = self._run(
            "abort",
            redis_keys(key_hash),
            [
                0,
                seq,
                undo["opened"],
                undo["payload"],
                undo["last"],
                undo["due"],
                grace,
                ttl,
                undo.get("kind", "fire"),
                undo["at"],
                undo.get("due_fixed", 0),
                undo.get("added", 0),
                undo.get("item", ""),
                undo.get("pending", 0),
                undo.get("flight", 0),
            ],
        )
        if int(out[0]):
            self._record(key_hash, out[1])

    def fire(self, key_hash, seq, *, overlap, lease, now=None, store=None, collect_limit=None):
        grace, ttl = self._limits()
        out = self._run(
            "fire",
            redis_keys(key_hash),
            [_now(now), -1 if seq is None else seq, int(overlap), int(lease * US), grace, ttl],
        )
        action = int(out[0])
        if action == -1:
            return FireDecision(FireAction.MISSING)
        lost = int(out[1])
        if lost:
            self._mark_lost(key_hash, lost)
        if action == 0:
            return FireDecision(FireAction.DROP)
        if action == 1:
            dispatch = Dispatch(key_hash, int(out[2]), int(out[3]) / US, self.store)
            return FireDecision(FireAction.REARM, dispatch=dispatch)
        if action == 2:
            at = int(out[2])
            watchdog = Dispatch(key_hash, at, int(out[3]) / US, self.store, "watch") if at else None
            return FireDecision(FireAction.WAIT, dispatch=watchdog)
        (
            _a,
            _l,
            run_id,
            flight_id,
            claimed,
            payload,
            first,
            last,
            due,
            started,
            snap,
            attempt,
            fseq,
            fcd,
        ) = out
        self._record(key_hash, snap)
        raw = {_s(snap[i]): _s(snap[i + 1]) for i in range(0, len(snap), 2)}
        claim = Claim(
            key_hash=key_hash,
            key=raw.get("k", ""),
            task_name=raw.get("tn", ""),
            run_id=int(run_id),
            flight_id=int(flight_id),
            triggers=int(claimed),
            payload=json.loads(payload) if payload else None,
            first_trigger_at=_dt(first),
            last_trigger_at=_dt(last),
            due_at=_dt(due),
            started_at=_dt(started),
            store=self.store,
            attempt=int(attempt),
        )
        self._record_run(key_hash, claim)
        follow = Dispatch(key_hash, int(fseq), int(fcd) / US, self.store) if int(fseq) else None
        return FireDecision(FireAction.CLAIM, claim=claim, dispatch=follow)

    def _record_run(self, key_hash: str, claim: Claim) -> None:
        """The ``DebounceRun`` row of a claim (best effort: the claim stands either way)."""
        row = (
            DebounceKey.objects.using(self.alias)
            .filter(key_hash=key_hash)
            .values_list("pk", flat=True)
            .first()
        )
        if row is None:
            return
        try:
            with transaction.atomic(using=self.alias):
                DebounceRun.objects.using(self.alias).create(
                    debounce_key_id=row,
                    store="redis",
                    task_name=claim.task_name,
                    flight_id=claim.flight_id,
                    run_id=claim.run_id,
                    attempt=claim.attempt,
                    triggers=claim.triggers,
                    first_trigger_at=claim.first_trigger_at,
                    last_trigger_at=claim.last_trigger_at,
                    due_at=claim.due_at,
                    started_at=claim.started_at,
                    delay=max((claim.started_at - claim.last_trigger_at).total_seconds(), 0.0),
                )
        except DatabaseError:
            # The claim stands (the body must run); only its history row is missing.
            logger.error("django_debounce: run %s of %s already recorded", claim.run_id, claim.key)

    def finish(self, key_hash, run_id, *, ok, error="", retry_in=None, store=None, now=None):
        grace, ttl = self._limits()
        retry_us = -1 if ok or retry_in is None else int(max(retry_in, 0.0) * US)
        applied, seq, countdown, now_us, snap, lost = self._run(
            "finish",
            redis_keys(key_hash),
            [_now(now), run_id, int(ok), grace, ttl, retry_us],
        )
        if not int(applied):
            if int(lost):
                self._record(key_hash, snap, lost_run=int(lost))
            self._mark_lost(key_hash, run_id)
            return (
                Dispatch(key_hash, int(seq), int(countdown) / US, self.store) if int(seq) else None
            )
        if ok:
            outcome = DebounceRun.Outcome.SUCCESS
        elif retry_us >= 0:
            outcome = DebounceRun.Outcome.RETRY
        else:
            outcome = DebounceRun.Outcome.FAILURE
        try:
            DebounceRun.objects.using(self.alias).filter(
                debounce_key__key_hash=key_hash,
                store="redis",
                run_id=run_id,
                outcome=DebounceRun.Outcome.RUNNING,
            ).update(outcome=outcome, finished_at=_dt(now_us), error=error)
        except DatabaseError:  # Redis has the finish; the follow-up must still be published
            logger.exception("django_debounce: could not record the end of run %s", run_id)
        self._record(key_hash, snap)
        seq = int(seq)
        return Dispatch(key_hash, seq, int(countdown) / US, self.store) if seq else None

    def watch(self, key_hash, at, *, store=None, now=None):
        grace, ttl = self._limits()
        seq, countdown, kind, lost, snap = self._run(
            "watch", redis_keys(key_hash), [_now(now), at, grace, ttl]
        )
        if snap:
            self._record(key_hash, snap, lost_run=int(lost))
        seq = int(seq)
        return Dispatch(key_hash, seq, int(countdown) / US, self.store, _s(kind)) if seq else None

    def heartbeat(self, key_hash, run_id, lease, *, store=None, now=None):
        grace, ttl = self._limits()
        return bool(
            self._run(
                "heartbeat",
                redis_keys(key_hash),
                [_now(now), run_id, int(lease * US), grace, ttl],
            )
        )

    def flush(self, key_hash, *, now=None):
        grace, ttl = self._limits()
        (seq,) = self._run("flush", redis_keys(key_hash), [_now(now), grace, ttl])
        seq = int(seq)
        return Dispatch(key_hash, seq, 0.0, self.store) if seq else None

    def cancel(self, key_hash, *, now=None):
        grace, ttl = self._limits()
        dropped, snap = self._run("cancel", redis_keys(key_hash), [_now(now), grace, ttl])
        self._record(key_hash, snap)
        return int(dropped)

    def _live(self) -> list[tuple[str, str]]:
        return list(
            DebounceKey.objects.using(self.alias)
            .filter(store="redis")
            .exclude(state=DebounceKey.State.IDLE)
            .values_list("task_name", "key_hash")
        )

    def due_keys(self, now=None, task_names=None):
        candidates = [(t, h) for t, h in self._live() if task_names is None or t in task_names]
        if not candidates:
            return []
        pipe = self.client.pipeline(transaction=False)
        for _t, h in candidates:
            pipe.hmget(redis_key(h), "p", "d")
        limit = _us(now) if now else None
        if limit is None:
            seconds, micros = self.client.time()
            limit = int(seconds) * US + int(micros)
        out = []
        for (task_name, h), (p, d) in zip(candidates, pipe.execute(), strict=True):
            if int(p or 0) > 0 and int(d or 0) <= limit:
                out.append((task_name, h))
        return out

    def missing(self, key_hashes: list[str]) -> list[str]:
        """Key hashes whose state is not in Redis (expired, or Redis restarted empty)."""
        if not key_hashes:
            return []
        pipe = self.client.pipeline(transaction=False)
        for h in key_hashes:
            pipe.exists(redis_key(h))
        return [h for h, n in zip(key_hashes, pipe.execute(), strict=True) if not n]

    def live_hashes(self) -> list[str]:
        """Key hashes of rows mirrored from Redis that are not idle."""
        return [h for _t, h in self._live()]

    def held(self, candidates: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Of ``(task_name, key_hash)`` pairs whose record the database store owns, those
        whose Redis state still holds pending triggers or a lease: triggers that Redis took
        while a client had already timed out and fallen back (a Redis that hung, then
        resumed), which no record lists as live in Redis. One pipeline per 1,000 keys."""
        out = []
        for start in range(0, len(candidates), 1000):
            chunk = candidates[start : start + 1000]
            pipe = self.client.pipeline(transaction=False)
            for _t, h in chunk:
                pipe.hmget(redis_key(h), "p", "ru")
            for pair, (p, ru) in zip(chunk, pipe.execute(), strict=True):
                if int(p or 0) > 0 or int(ru or 0) > 0:
                    out.append(pair)
        return out

    def recover(self, *, grace, adopt=(), now=None, also=()):
        """Recover every key the records list as live in Redis, and the pairs in ``also``
        (``(task_name, key_hash)``, e.g. from ``held``)."""
        dispatch_grace, ttl = self._limits()
        out: list[tuple[str, Dispatch]] = []
        for task_name, h in dict.fromkeys([*self._live(), *also]):
            try:
                lost, seq, countdown, snap = self._run(
                    "recover", redis_keys(h), [_now(now), int(grace * US), ttl, dispatch_grace]
                )
            except Exception:  # one bad key must not stop the recovery of every other key
                logger.exception("django_debounce: recovery of key %s failed", h)
                continue
            self._record(h, snap, lost_run=int(lost))
            if int(seq):
                out.append((task_name, Dispatch(h, int(seq), int(countdown) / US, self.store)))
        return out

    def live_state(self, key_hash):
        values = self.client.hmget(redis_key(key_hash), "p", "f", "T", "R", "M", "C", "ru", "q")
        if values[1] is None:
            return None
        p, f, t, r, m, c, ru, q = (int(v or 0) for v in values)
        state = "running" if ru else "pending" if p else "idle"
        return {
            "pending": p,
            "flight_id": f,
            "triggers": t,
            "runs": r,
            "merged": m,
            "cancelled": c,
            "state": state,
            "seq": q,
            "store_code": self.store,
        }

    def live_rows(self, key_hashes: list[str]) -> dict[str, dict[str, Any]]:
        """Live ``DebounceKey`` field values of keys held in Redis, in one pipeline (for the
        admin and the status command: the row is only written on flight transitions).
        Keys Redis does not hold are left out."""
        if not key_hashes:
            return {}
        fields = ("p", "f", "ft", "lt", "d", "ru", "T", "R", "M", "C", "lr", "lo")
        pipe = self.client.pipeline(transaction=False)
        for h in key_hashes:
            pipe.hmget(redis_key(h), *fields)
        out = {}
        for h, values in zip(key_hashes, pipe.execute(), strict=True):
            if values[1] is None:
                continue
            p, f, ft, lt, d, ru, t, r, m, c, lr = (int(v or 0) for v in values[:-1])
            out[h] = {
                "state": "running" if ru else "pending" if p else "idle",
                "pending": p,
                "flight_id": f,
                "first_trigger_at": _dt(ft),
                "last_trigger_at": _dt(lt),
                "due_at": _dt(d),
                "running_until": _dt(ru),
                "triggers": t,
                "runs": r,
                "merged": m,
                "cancelled": c,
                "last_run_at": _dt(lr),
                "last_outcome": _s(values[-1] or ""),
            }
        return out

    def pending_counts(self, key_hashes):
        if not key_hashes:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for h in key_hashes:
            pipe.hget(redis_key(h), "p")
        return {h: int(p or 0) for h, p in zip(key_hashes, pipe.execute(), strict=True)}
