"""The Redis store: one Lua script per operation, one round trip per trigger, and the due index
in sorted sets (docs/design.md, "The Redis layout").

Every Redis key of a debounce key lives under its shard's hash tag, ``<prefix>{<shard>}:``,
with a fixed number of shards (``SHARDS``): a script touches one slot, and a Redis Cluster
spreads the shards over its nodes. The state of a key is one hash whose zero fields are left
out; its due index entry is in the sorted set of its shard and task. Pending and running keys
have no TTL (the index finds them); an idle key's hash expires ``DEBOUNCE_REDIS_IDLE_TTL``
seconds after ``max(wait, max_wait)``.

The database keeps the durable record: the ``DebounceKey`` row is written when a flight opens
(by the trigger), and from the records the scripts append at claim, finish and lost runs
(``recorder.py``, in the workers' main processes, in batches): never per merged trigger.

The client is that of ``DEBOUNCE_REDIS_URL`` or ``DEBOUNCE_REDIS_CLUSTER`` (redis-py's
``RedisCluster``) when set, else that of the django-redis cache ``DEBOUNCE_CACHE_ALIAS``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import cached_property, lru_cache
from importlib import resources
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from django_debounce import conf, dbtime
from django_debounce.backends import record
from django_debounce.backends.base import BaseBackend, Taken, TriggerManyError
from django_debounce.backends.errors import mark_unopened, refused
from django_debounce.state import (
    Claim,
    Dispatch,
    FireAction,
    FireDecision,
    FlightOptions,
    IndexStats,
    TriggerResult,
)

logger = logging.getLogger("django_debounce")

US = 1_000_000
SHARDS = 16
SHORT_KEY = 40  # characters of the readable key kept in the hash, for monitoring
OPERATIONS = (
    "trigger",
    "fire",
    "finish",
    "heartbeat",
    "extend",
    "flush",
    "cancel",
    "take",
    "release",
    "restore",
    "adopt",
)
# The reply of trigger.lua's full path and of fire.lua's claim, by position (the scripts'
# headers list the same names).
TRIGGER_REPLY = (
    "flight_id",
    "pending",
    "due",
    "seq",
    "countdown",
    "opened",
    "lost",
    "triggers",
    "runs",
    "merged",
    "cancelled",
    "run_id",
    "now",
)
CLAIM_REPLY = (
    "action",
    "lost",
    "run_id",
    "flight_id",
    "claimed",
    "payload",
    "first",
    "last",
    "due",
    "now",
    "attempt",
    "follow_seq",
    "follow_countdown",
    "short_key",
    "attempted",
)


def _dt(us: int | str | bytes) -> datetime | None:
    us = int(us)
    if us <= 0:
        return None
    return datetime.fromtimestamp(us / US, tz=UTC)


def _us(value: datetime) -> int:
    return int(round(value.timestamp() * US))


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _now(now: datetime | None) -> int:
    """ARGV[1] of every script: the time override in microseconds, 0 for Redis ``TIME``."""
    return _us(now) if now is not None else 0


def _wants_seed(out: Any) -> bool:
    """Whether a reply of trigger.lua is ``{'seed', now}``: the key is new to Redis, its
    durable record must be read first (``now``: the step's time in microseconds)."""
    return (
        isinstance(out, (list, tuple)) and len(out) == 2 and _s(out[0]) == "seed"  # type: ignore[arg-type]
    )


@lru_cache(maxsize=4096)  # a trigger asks twice (its state key and its script's header)
def key_id(key_hash: str) -> str:
    """The id of a key in Redis: its SHA-256 (64 hex digits) in unpadded base64url, 43
    characters (the index holds one per pending key: 21 bytes fewer than hex)."""
    return base64.urlsafe_b64encode(bytes.fromhex(key_hash)).rstrip(b"=").decode()


def key_hash_of(key_id_: str) -> str:
    """The key hash (64 hex digits) of a Redis key id."""
    return base64.urlsafe_b64decode(key_id_ + "=").hex()


def shard_of(key_hash: str) -> int:
    """The shard of a key hash: its first 16 bits modulo ``SHARDS``."""
    return int(key_hash[:4], 16) % SHARDS


def _pack(parts: list[bytes]) -> bytes:
    """RESP bulk strings of ``parts``, without the array header."""
    return b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def short_key(key: str, task_name: str) -> str:
    """The readable key kept in the hash for monitoring: ``''`` for a task's default key
    (the task name and its arguments: the index key and ``pl`` show them), else the key,
    cut to ``SHORT_KEY`` characters with a trailing ``…`` when longer."""
    if key.startswith(task_name + ":{"):
        return ""
    return key if len(key) <= SHORT_KEY else key[: SHORT_KEY - 1] + "…"


def idle_ttl_ms(options: FlightOptions) -> int:
    """Milliseconds an idle key's hash stays: the lodash edge of its next trigger still needs
    its last trigger and last run for ``max(wait, max_wait)``."""
    horizon = max(options.wait, options.max_wait or 0.0)
    return int((horizon + conf.seconds_of("REDIS_IDLE_TTL")) * 1000) + 1


def registered_options() -> dict[str, FlightOptions]:
    """Task name -> options of every debounced task registered in this process."""
    from django_debounce.tasks import registered_debounced_tasks

    return {task.name: task.flight_options() for task in registered_debounced_tasks()}


class RedisBackend(BaseBackend):
    """Lua-scripted store on a redis-py client (standalone, Sentinel or Cluster)."""

    name = "redis"
    store = "r"

    # -- connection and scripts -------------------------------------------------------------

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
        backend = settings.CACHES.get(alias, {}).get("BACKEND", "")
        if not backend.startswith("django_redis."):
            raise ImproperlyConfigured(
                f"DEBOUNCE_BACKEND='redis' needs DEBOUNCE_REDIS_URL, DEBOUNCE_REDIS_CLUSTER, or "
                f"DEBOUNCE_CACHE_ALIAS={alias!r} to be a django-redis cache "
                f"(django_redis.cache.RedisCache), not {backend!r}. Configure one, or use "
                "DEBOUNCE_BACKEND='auto' or 'database'."
            )
        from django_redis import get_redis_connection

        return get_redis_connection(alias)

    @cached_property
    def cluster(self) -> bool:
        """Whether the client is a Redis Cluster client."""
        from redis.cluster import RedisCluster

        return isinstance(self.client, RedisCluster)

    @cached_property
    def prefix(self) -> str:
        """The prefix of every Redis key of this store (``DEBOUNCE_REDIS_PREFIX``)."""
        value = conf.get("REDIS_PREFIX")
        if not isinstance(value, str) or not value or "{" in value or "}" in value:
            raise ImproperlyConfigured(
                f"DEBOUNCE_REDIS_PREFIX must be a non-empty str without braces, got {value!r}."
            )
        return value

    def shard_prefix(self, shard: int) -> str:
        """``<prefix>{<shard>}:``: every Redis key of the shard starts with it."""
        return f"{self.prefix}{{{shard}}}:"

    def state_key(self, key_hash: str) -> str:
        """The hash holding the state of ``key_hash``."""
        return self.shard_prefix(shard_of(key_hash)) + key_id(key_hash)

    @cached_property
    def scripts(self) -> dict[str, Any]:
        """Scripts are registered once; they are called by SHA and loaded again on NOSCRIPT."""
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
        self._heads: dict[tuple[Any, ...], tuple[bytes, bytes, bytes]] = {}
        return threading.local()

    def _direct_connection(self) -> Any:
        """This thread's connection of the direct path, checked as redis-py's pool checks one
        it hands out: one the server closed (a restart, an idle timeout) or that holds unread
        data is made again before a command goes out on it."""
        local = self._direct
        assert local is not None
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            pool = self.client.connection_pool
            conn = local.conn = pool.connection_class(**pool.connection_kwargs)
            local.pid = os.getpid()
        elif getattr(conn, "_sock", None) is not None:  # (a dropped one connects at send)
            try:
                if conn.can_read():
                    raise RedisConnectionError("Connection has data")
            except (RedisConnectionError, RedisTimeoutError, OSError):
                conn.disconnect()
        return conn

    def _send_direct(self, packed: bytes) -> Any:
        """Send one packed command on a connection this thread keeps for the trigger hot path
        and read its reply: the hot path skips redis-py's per-command machinery (pool
        checkout, retries, observability), which costs more than the script itself. The
        connection is made with the pool's own settings (host, TLS, timeouts) and made again
        after a fork. Errors are those of the normal path (``ConnectionError``,
        ``TimeoutError``, ``ResponseError`` such as ``NoScriptError``); the connection is
        dropped on a connection error."""
        conn = self._direct_connection()
        try:
            conn.send_packed_command([packed], check_health=False)
            return conn.read_response()
        except (RedisConnectionError, RedisTimeoutError, OSError):
            conn.disconnect()
            raise

    def _send_direct_many(self, packed: list[bytes]) -> list[Any]:
        """``_send_direct`` for several packed commands in one write (a pipeline without
        redis-py's per-command packing and parsing): their replies in order, an error reply
        (``ResponseError``, such as ``NoScriptError``) as the reply itself, as
        ``pipeline.execute(raise_on_error=False)`` gives it. A connection error drops the
        connection and is raised: which of the commands ran is then unknown, as for a
        pipeline."""
        conn = self._direct_connection()
        out: list[Any] = []
        try:
            conn.send_packed_command([b"".join(packed)], check_health=False)
            for _ in packed:
                try:
                    out.append(conn.read_response())
                except ResponseError as exc:  # an error reply: the next reply follows it
                    out.append(exc)
        except BaseException:  # (a reply left unread would be taken for the next command's)
            conn.disconnect()
            raise
        return out

    def _run(self, op: str, key: str, args: Sequence[Any]) -> Any:
        """EVALSHA of script ``op`` with KEYS[1] = ``key``; loads it again after NOSCRIPT (a
        restarted or flushed server). One round trip in the normal case."""
        script = self.scripts[op]
        try:
            return self.client.evalsha(script.sha, 1, key, *args)
        except NoScriptError:
            script.sha = self.client.script_load(script.script)
            return self.client.evalsha(script.sha, 1, key, *args)

    def _head(self, key_hash: str, task_name: str, options: FlightOptions) -> list[Any]:
        """ARGV[2:8] of the single-key scripts (common.lua): id, overlap, retake, direct,
        idle TTL, task name."""
        return [key_id(key_hash), *self._consts(task_name, options)[0]]

    def _consts(self, task_name: str, options: FlightOptions) -> tuple[list[Any], list[int]]:
        """The parts of a trigger's script arguments that depend on the task alone: the
        header after the id (see ``_head``) and trigger.lua's ARGV[9:12] (wait and max_wait in
        microseconds, edge, collect limit). Kept for the last task asked: the options of a
        task are one object until a setting changes (its ``flight_options`` cache), and a
        setting change makes a new backend instance."""
        consts = self.__dict__.get("_consts_cache")
        if consts is None or consts[0] is not options or consts[1] != task_name:
            retake, direct = self._limits()
            head = [int(options.overlap), retake, direct, idle_ttl_ms(options), task_name]
            tail = [
                int(options.wait * US),
                -1 if options.max_wait is None else int(options.max_wait * US),
                (2 if not options.trailing else 1) if options.leading else 0,
                options.collect_limit or 0,
            ]
            consts = self.__dict__["_consts_cache"] = (options, task_name, head, tail)
        return consts[2], consts[3]

    def _limits(self) -> tuple[int, int]:
        """Retake and direct windows in microseconds. Read once per backend instance: the
        instance is rebuilt when a ``DEBOUNCE_`` setting changes."""
        limits = self.__dict__.get("_limits_cache")
        if limits is None:
            retake = conf.seconds_of("DISPATCH_GRACE")
            direct = conf.seconds_of("PUMP_INTERVAL")
            limits = self.__dict__["_limits_cache"] = (int(retake * US), int(direct * US))
        return limits

    # -- triggers ---------------------------------------------------------------------------

    def trigger(self, *, task_name, key, key_hash, payload_json, options, now=None):
        head_consts, tail = self._consts(task_name, options)
        limit = tail[3]
        rkey = self.state_key(key_hash)
        head = [key_id(key_hash), *head_consts]
        out = None
        if now is None and not limit and self._direct is not None:
            try:
                out = self._trigger_hot(rkey, payload_json, head, tail)
            except NoScriptError:
                out = None  # the normal path loads the script again
        if out is None:
            out = self._run("trigger", rkey, [_now(now), *head, payload_json, *tail, "", ""])
        seeded = False
        held: set[str] = set()
        if _wants_seed(out):
            # new to Redis: open the durable record and continue its counters (another
            # process may open the flight meanwhile, so the second call can merge)
            seed = record.seed(
                key_hash,
                key,
                task_name,
                None if options.collect else payload_json,
                options.wait,
                at_us=int(out[1]),
                held_out=held,
            )
            seeded = True
            try:
                out = self._run(
                    "trigger",
                    rkey,
                    [_now(now), *head, payload_json, *tail, short_key(key, task_name), seed],
                )
            except Exception as exc:
                if refused(exc):
                    mark_unopened(exc, self._absent([key_hash]))
                raise
        if isinstance(out, (bytes, str)):  # merged: "flight pending due", nothing to publish
            f_text, p_text, d_text = out.split()
            return TriggerResult(key, int(f_text), int(p_text), _dt(d_text), False), None
        reply = dict(zip(TRIGGER_REPLY, out, strict=True))
        seq = int(reply["seq"])
        dispatch = (
            Dispatch(key_hash, seq, int(reply["countdown"]) / US, self.store, task_name, key)
            if seq
            else None
        )
        pending = int(reply["pending"])
        result = TriggerResult(
            key=key,
            flight_id=int(reply["flight_id"]),
            pending=pending,
            due_at=_dt(reply["due"]),
            scheduled=dispatch is not None,
            dropped=pending == 0,
        )
        lost = int(reply["lost"])
        if int(reply["opened"]) and not seeded:
            record.opened(
                [
                    record.Opened(
                        key_hash=key_hash,
                        key=key,
                        task_name=task_name,
                        at_us=int(reply["now"]),
                        state="pending",
                        pending=pending,
                        flight_id=int(reply["flight_id"]),
                        due_us=int(reply["due"]),
                        payload_json=None if options.collect else payload_json,
                        triggers=int(reply["triggers"]),
                        runs=int(reply["runs"]),
                        merged=int(reply["merged"]),
                        cancelled=int(reply["cancelled"]),
                        run_id=int(reply["run_id"]),
                    )
                ]
            )
        if lost:
            record.lost_runs(key_hash, [lost], int(reply["now"]))
        if held and int(reply["opened"]):
            record.mark_beside(record.alias(), [key_hash], _dt(reply["now"]))
        return result, dispatch

    def trigger_many(self, *, task_name, items, options, now=None):
        """One pipeline for every trigger, a second for the keys new to Redis (after one
        statement reads and opens their durable records), one statement for the records of
        the flights that opened."""
        if not items:
            return []
        wait_us = int(options.wait * US)
        max_wait_us = -1 if options.max_wait is None else int(options.max_wait * US)
        edge = (2 if not options.trailing else 1) if options.leading else 0
        tail = [wait_us, max_wait_us, edge, options.collect_limit or 0]
        script = self.scripts["trigger"]
        replies = self._pipeline_triggers(script, task_name, items, options, tail, now, None)
        seeded: set[int] = set()
        held: set[str] = set()  # keys whose rows the database store holds (seed_many)
        for _round in range(3):  # a key whose hash vanished again meanwhile asks again
            fresh = [i for i, out in enumerate(replies) if _wants_seed(out)]
            if not fresh:
                break
            # The first trigger of each key new to Redis opens its record and carries the
            # seed; the key's later triggers in the batch follow it in the same pipeline and
            # join the flight it opened as plain triggers, as they would one by one.
            first: dict[str, int] = {}
            for i in fresh:
                first.setdefault(items[i][1], i)
            seeds = record.seed_many(
                [
                    (items[i][1], items[i][0], task_name, None if options.collect else items[i][2])
                    for i in first.values()
                ],
                options.wait,
                at_us=max(int(replies[i][1]) for i in fresh),
                held_out=held,
            )
            again = self._pipeline_triggers(
                script,
                task_name,
                [items[i] for i in fresh],
                options,
                tail,
                now,
                [seeds[items[i][1]] if first[items[i][1]] == i else None for i in fresh],
            )
            for i, out in zip(fresh, again, strict=True):
                replies[i] = out
            seeded.update(first.values())
            # A seeded trigger that failed (a refusal: OOM, READONLY) opened nothing, and its
            # key's later triggers, which found no hash, fail with it: seeding one of them
            # next would count the failed one again (the row it upserted reads as a lost
            # flight) and keep the batch from falling back as one.
            for i in fresh:
                out = replies[i]
                if _wants_seed(out) and isinstance(replies[first[items[i][1]]], BaseException):
                    replies[i] = replies[first[items[i][1]]]
        results: list[Any] = []
        opened: list[record.Opened] = []
        errors: dict[int, BaseException] = {}
        for i, ((key, hashed, payload), out) in enumerate(zip(items, replies, strict=True)):
            if _wants_seed(out):
                out = RuntimeError(
                    f"The Redis state of key {key!r} vanished three times while this trigger "
                    "was counted (something deletes it); it was not counted: trigger again."
                )
            if isinstance(out, BaseException):
                errors[i] = out
                results.append(None)
                continue
            if isinstance(out, (bytes, str)):
                f_text, p_text, d_text = _s(out).split()
                results.append(
                    (TriggerResult(key, int(f_text), int(p_text), _dt(d_text), False), None)
                )
                continue
            reply = dict(zip(TRIGGER_REPLY, out, strict=True))
            seq = int(reply["seq"])
            dispatch = (
                Dispatch(hashed, seq, int(reply["countdown"]) / US, self.store, task_name, key)
                if seq
                else None
            )
            pending = int(reply["pending"])
            results.append(
                (
                    TriggerResult(
                        key,
                        int(reply["flight_id"]),
                        pending,
                        _dt(reply["due"]),
                        dispatch is not None,
                        dropped=pending == 0,
                    ),
                    dispatch,
                )
            )
            if int(reply["opened"]) and i not in seeded:
                opened.append(
                    record.Opened(
                        hashed, key, task_name, int(reply["now"]), "pending", pending,
                        int(reply["flight_id"]), int(reply["due"]),
                        None if options.collect else payload, int(reply["triggers"]),
                        int(reply["runs"]), int(reply["merged"]), int(reply["cancelled"]),
                        int(reply["run_id"]),
                    )
                )  # fmt: skip
            if int(reply["lost"]):
                record.lost_runs(hashed, [int(reply["lost"])], int(reply["now"]))
            if hashed in held and int(reply["opened"]):
                record.mark_beside(record.alias(), [hashed], _dt(reply["now"]))
        record.opened(opened)
        if errors:
            error = TriggerManyError(results, errors)
            refused_ = {items[i][1] for i, e in errors.items() if i in seeded and refused(e)}
            mark_unopened(error, self._absent(sorted(refused_)))
            raise error
        return results

    def _absent(self, key_hashes: list[str]) -> set[str]:
        """Which of ``key_hashes`` have no state in Redis (a read: Redis answers it when it
        refuses writes); none when Redis cannot say. A trigger whose script Redis refused
        opened no flight only if no other trigger opened one meanwhile (``mark_unopened``)."""
        if not key_hashes:
            return set()
        try:
            pipe = self.client.pipeline(transaction=False)
            for h in key_hashes:
                pipe.exists(self.state_key(h))
            return {h for h, n in zip(key_hashes, pipe.execute(), strict=True) if not n}
        except Exception:  # noqa: BLE001 - unknown: the database store keeps the mark
            return set()

    def _pipeline_triggers(
        self,
        script: Any,
        task_name: str,
        items: Sequence[tuple[str, str, str]],
        options: FlightOptions,
        tail: list[Any],
        now: datetime | None,
        seeds: Sequence[str | None] | None,
    ) -> list[Any]:
        """The trigger script for each item in one pipeline (one round trip per node);
        ``seeds``: the seed of each item (``record.seed_many``), ``None`` for none."""

        def send(indexes: list[int]) -> list[Any]:
            if self._direct is not None:
                packed = self._packed_triggers(
                    script, task_name, items, indexes, options, tail, now, seeds
                )
                return self._send_direct_many(packed)
            calls = []
            for i in indexes:
                key, hashed, payload = items[i]
                seed = None if seeds is None else seeds[i]
                extra = ["", ""] if seed is None else [short_key(key, task_name), seed]
                calls.append(
                    (
                        self.state_key(hashed),
                        [
                            "EVALSHA",
                            script.sha,
                            1,
                            self.state_key(hashed),
                            _now(now),
                            *self._head(hashed, task_name, options),
                            payload,
                            *tail,
                            *extra,
                        ],
                    )
                )
            return self._pipelined(calls)

        replies = send(list(range(len(items))))
        missing = [i for i, out in enumerate(replies) if isinstance(out, NoScriptError)]
        if missing:  # a restarted or flushed server: those triggers did not run
            script.sha = self.client.script_load(script.script)
            for i, out in zip(missing, send(missing), strict=True):
                replies[i] = out
        return replies

    def _packed_triggers(
        self,
        script: Any,
        task_name: str,
        items: Sequence[tuple[str, str, str]],
        indexes: list[int],
        options: FlightOptions,
        tail: list[Any],
        now: datetime | None,
        seeds: Sequence[str | None] | None,
    ) -> list[bytes]:
        """The commands of ``_pipeline_triggers`` for ``items[i]`` of ``indexes``, packed in
        RESP (the constant parts once): ``EVALSHA trigger 1 rkey now *head payload *tail
        short_key seed``, as ``_trigger_hot`` packs one."""
        sha = script.sha.encode()
        command = b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$1\r\n1\r\n" % (
            3 + 1 + 14,
            len(sha),
            sha,
        )
        start = _pack([str(_now(now)).encode()])
        middle = _pack([str(a).encode() for a in self._consts(task_name, options)[0]])
        end = _pack([str(a).encode() for a in tail])
        unseeded = b"$0\r\n\r\n$0\r\n\r\n"
        out = []
        for i in indexes:
            key, hashed, payload = items[i]
            k = self.state_key(hashed).encode()
            d = key_id(hashed).encode()
            p = payload.encode()
            seed = None if seeds is None else seeds[i]
            extra = (
                unseeded
                if seed is None
                else _pack([short_key(key, task_name).encode(), seed.encode()])
            )
            out.append(
                b"%s$%d\r\n%s\r\n%s$%d\r\n%s\r\n%s$%d\r\n%s\r\n%s%s"
                % (command, len(k), k, start, len(d), d, middle, len(p), p, end, extra)
            )
        return out

    def _pipelined(self, calls: list[tuple[str, list[Any]]]) -> list[Any]:
        """Run ``(routing key, command)`` calls in one pipeline (per node of a Redis Cluster:
        redis-py's cluster pipeline refuses scripts); a reply is the command's result or its
        error. A call that met a cluster redirection (slots moving) is made again alone."""
        if not self.cluster:
            pipe = self.client.pipeline(transaction=False)
            for _key, command in calls:
                pipe.execute_command(*command)
            try:
                return list(pipe.execute(raise_on_error=False))
            finally:
                pipe.reset()
        from redis.exceptions import AskError, MovedError, TryAgainError

        by_node: dict[str, list[int]] = defaultdict(list)
        nodes: dict[str, Any] = {}
        for i, (key, _command) in enumerate(calls):
            node = self.client.get_node_from_key(key)
            by_node[node.name].append(i)
            nodes[node.name] = node
        out: list[Any] = [None] * len(calls)
        for name, indexes in by_node.items():
            pipe = self.client.get_redis_connection(nodes[name]).pipeline(transaction=False)
            for i in indexes:
                pipe.execute_command(*calls[i][1])
            try:
                replies = pipe.execute(raise_on_error=False)
            finally:
                pipe.reset()
            for i, reply in zip(indexes, replies, strict=True):
                if isinstance(reply, (MovedError, AskError, TryAgainError)):
                    try:
                        reply = self.client.execute_command(*calls[i][1])
                    except Exception as exc:  # returned as the reply, as the pipeline does
                        reply = exc
                out[i] = reply
        return out

    def _trigger_hot(self, rkey: str, payload: str, head: list[Any], tail: list[Any]) -> Any:
        """``EVALSHA trigger 1 rkey 0 *head payload *tail '' ''`` through ``_send_direct``; the
        constant parts of the command are packed once per task configuration."""
        cache_key = (*head[1:], *tail)
        packed = self._heads.get(cache_key)
        if packed is None:
            sha = self.scripts["trigger"].sha.encode()
            packed = self._heads[cache_key] = (
                b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n1\r\n" % (3 + 1 + 14, sha),
                _pack([str(a).encode() for a in head[1:]]),
                _pack([str(a).encode() for a in tail]) + b"$0\r\n\r\n$0\r\n\r\n",
            )
        command, middle, end = packed
        k = rkey.encode()
        i = head[0].encode()
        p = payload.encode()
        return self._send_direct(
            b"".join(
                (
                    command,
                    b"$%d\r\n" % len(k),
                    k,
                    b"\r\n$1\r\n0\r\n$%d\r\n" % len(i),
                    i,
                    b"\r\n",
                    middle,
                    b"$%d\r\n" % len(p),
                    p,
                    b"\r\n",
                    end,
                )
            )
        )

    # -- the pump ---------------------------------------------------------------------------

    def _task_names(self, task_names: Sequence[str] | None) -> list[str]:
        if task_names is not None:
            return list(task_names)
        return sorted(registered_options())

    def peek(self, task_names, *, now=None):
        names = self._task_names(task_names)
        if not names:
            return None
        keys = [self.shard_prefix(s) + "next:" + t for s in range(SHARDS) for t in names]
        if self.cluster:
            values = self.client.mget_nonatomic(keys)
            clock = self.client.time() if now is None else None
        else:
            pipe = self.client.pipeline(transaction=False)
            pipe.mget(keys)
            if now is None:
                pipe.time()
            got = pipe.execute()
            values, clock = got[0], (got[1] if now is None else None)
        scores = [int(v) for v in values if v is not None]
        if not scores:
            return None
        if now is not None:
            at = _us(now)
        else:
            assert clock is not None
            at = int(clock[0]) * US + int(clock[1])
        return (min(scores) - at) / US

    def _due_shards(self, names: list[str], now: datetime | None) -> list[int]:
        """Shards whose `next` of some task in ``names`` is due (a lower bound: a shard may
        have nothing due after all)."""
        keys = [self.shard_prefix(s) + "next:" + t for s in range(SHARDS) for t in names]
        values = self.client.mget_nonatomic(keys) if self.cluster else self.client.mget(keys)
        if now is not None:
            at = _us(now)
        else:
            seconds, micros = self.client.time()
            at = int(seconds) * US + int(micros)
        due = set()
        for i, value in enumerate(values):
            if value is not None and int(value) <= at:
                due.add(i // len(names))
        return sorted(due)

    def take(self, tasks, limit, *, now=None):
        tasks = dict(tasks) if tasks is not None else registered_options()
        names = sorted(tasks)
        if not names:
            return Taken()
        retake, direct = self._limits()
        per_task: list[Any] = []
        for name in names:
            per_task += [name, idle_ttl_ms(tasks[name])]
        dispatches: list[Dispatch] = []
        again = 0
        for shard in self._due_shards(names, now):
            if len(dispatches) >= limit:
                break
            prefix = self.shard_prefix(shard)
            out = self.scripts["take"](
                keys=[prefix + "rec"],
                args=[
                    _now(now),
                    limit - len(dispatches),
                    retake,
                    direct,
                    prefix,
                    len(names),
                    *per_task,
                ],
            )
            again += int(out[0])
            for i in range(2, len(out), 4):
                label, payload = _s(out[i + 3]), None
                if label.startswith("\x00"):  # take.lua: the payload, the key is not whole
                    label, payload = "", label[1:]
                dispatches.append(
                    Dispatch(
                        key_hash_of(_s(out[i])),
                        int(out[i + 1]),
                        0.0,
                        self.store,
                        names[int(out[i + 2]) - 1],
                        label,
                        payload,
                    )
                )
        return Taken(dispatches, again, self.peek(names, now=now))

    def release(self, dispatches, *, now=None):
        no_options = FlightOptions(wait=0.0)
        for dispatch in dispatches:
            self._run(
                "release",
                self.state_key(dispatch.key_hash),
                [
                    _now(now),
                    *self._head(dispatch.key_hash, dispatch.task_name, no_options),
                    dispatch.seq,
                ],
            )

    # -- the worker -------------------------------------------------------------------------

    def fire(self, key_hash, seq, *, task_name, options, now=None, store=None):
        out = self._run(
            "fire",
            self.state_key(key_hash),
            [
                _now(now),
                *self._head(key_hash, task_name, options),
                -1 if seq is None else seq,
                int(options.lease * US),
                options.collect_limit or 0,
                options.collect_bytes or 0,
            ],
        )
        action = int(out[0])
        if action == -1:
            return FireDecision(FireAction.MISSING)
        if action == 0:
            return FireDecision(FireAction.DROP)
        if action == 1:
            q = int(out[2])
            dispatch = Dispatch(key_hash, q, int(out[3]) / US, self.store, task_name) if q else None
            return FireDecision(FireAction.REARM, dispatch=dispatch)
        if action == 2:
            return FireDecision(FireAction.WAIT)
        reply = dict(zip(CLAIM_REPLY, out, strict=True))
        short = _s(reply["short_key"])
        payload = _s(reply["payload"])
        claim = Claim(
            key_hash=key_hash,
            key="" if short.endswith("…") else short,
            task_name=task_name,
            run_id=int(reply["run_id"]),
            flight_id=int(reply["flight_id"]),
            triggers=int(reply["claimed"]),
            payload=json.loads(payload) if payload else None,
            first_trigger_at=_dt(reply["first"]),  # type: ignore[arg-type]
            last_trigger_at=_dt(reply["last"]),  # type: ignore[arg-type]
            due_at=_dt(reply["due"]),  # type: ignore[arg-type]
            started_at=_dt(reply["now"]),  # type: ignore[arg-type]
            store=self.store,
            attempt=int(reply["attempt"]),
            attempted=int(reply["attempted"]),
        )
        fseq = int(reply["follow_seq"])
        follow = (
            Dispatch(key_hash, fseq, int(reply["follow_countdown"]) / US, self.store, task_name)
            if fseq
            else None
        )
        return FireDecision(FireAction.CLAIM, claim=claim, dispatch=follow)

    def finish(self, key_hash, run_id, end, *, task_name, options, now=None, store=None):
        retry_us = -1 if end.ok or end.retry_in is None else int(max(end.retry_in, 0.0) * US)
        _applied, seq, countdown, _lost = self._run(
            "finish",
            self.state_key(key_hash),
            [
                _now(now),
                *self._head(key_hash, task_name, options),
                run_id,
                int(end.ok),
                retry_us,
                end.error.replace("|", "/")[:2000],
                int(end.give_up),
                _us(end.started_at) if end.started_at is not None else 0,
            ],
        )
        seq = int(seq)
        return Dispatch(key_hash, seq, int(countdown) / US, self.store, task_name) if seq else None

    def heartbeat(self, key_hash, run_id, lease, *, task_name, options, now=None, store=None):
        return bool(
            self._run(
                "heartbeat",
                self.state_key(key_hash),
                [_now(now), *self._head(key_hash, task_name, options), run_id, int(lease * US)],
            )
        )

    def extend(self, runs, *, now=None):
        by_shard: dict[int, list[int]] = defaultdict(list)
        for i, run in enumerate(runs):
            by_shard[shard_of(run.key_hash)].append(i)
        retake, _direct = self._limits()
        out: list[float | None] = [None] * len(runs)
        for shard, indexes in by_shard.items():
            args: list[Any] = []
            for i in indexes:
                run = runs[i]
                args += [key_id(run.key_hash), run.seq, int(run.lease * US), run.task_name]
            prefix = self.shard_prefix(shard)
            got = self.scripts["extend"](
                keys=[prefix + "rec"], args=[_now(now), prefix, retake, len(indexes), *args]
            )
            for i, value in zip(indexes, got, strict=True):
                value = int(value)
                out[i] = value / US if value >= 0 else None
        return out

    # -- operators --------------------------------------------------------------------------

    def flush(self, key_hash, *, task_name, options, now=None):
        seq, countdown = self._run(
            "flush",
            self.state_key(key_hash),
            [_now(now), *self._head(key_hash, task_name, options)],
        )
        seq = int(seq)
        return Dispatch(key_hash, seq, int(countdown) / US, self.store, task_name) if seq else None

    def cancel(self, key_hash, *, task_name, options, now=None):
        return int(
            self._run(
                "cancel",
                self.state_key(key_hash),
                [_now(now), *self._head(key_hash, task_name, options)],
            )
        )

    def due_keys(self, now=None, task_names=None):
        names = self._task_names(task_names)
        limit = _us(now) if now is not None else None
        if limit is None:
            seconds, micros = self.client.time()
            limit = int(seconds) * US + int(micros)
        out = []
        for name in names:
            for shard in range(SHARDS):
                prefix = self.shard_prefix(shard)
                ids = [_s(m) for m in self.client.zrange(prefix + "due:" + name, 0, -1)]
                if not ids:
                    continue
                pipe = self.client.pipeline(transaction=False)
                for i in ids:
                    pipe.hmget(prefix + i, "p", "d")
                for i, (p, d) in zip(ids, pipe.execute(), strict=True):
                    if int(p or 0) > 0 and int(d or 0) <= limit:
                        out.append((name, key_hash_of(i)))
        return out

    # -- the previous release ---------------------------------------------------------------

    def adopt(self, key_hash: str, task_name: str, options: FlightOptions) -> int:
        """Adopt the flight the previous release (0.1) keeps for ``key_hash`` in its own layout
        (``legacy.py``): 1 adopted, 0 nothing to adopt, -1 a 0.1 run of the key is live (its
        durable record is rechecked after its lease). Standalone Redis only."""
        if self.cluster:
            return 0
        done = int(
            self._run(
                "adopt",
                self.state_key(key_hash),
                [0, *self._head(key_hash, task_name, options), f"debounce:{{{key_hash}}}"],
            )
        )
        if done < 0:
            from django_debounce.backends import record

            record.recheck_later(key_hash)
        return done

    # -- the durable record -------------------------------------------------------------------

    def recheck(self, *, limit: int = 500, now: datetime | None = None) -> int:
        """Compare with Redis the records of keys held in Redis whose ``recheck_at`` passed
        (a change that should have reached the record did not): a key Redis still holds gets
        its record brought up to date (no "pending" record outlives its flight); a key whose
        Redis state is gone (evicted, Redis restarted without persistence) gets its flight
        rebuilt from the record and run (at least once). Found through the index on
        ``recheck_at``: the cost grows with what is overdue, never with the number of keys.
        Returns how many flights were rebuilt."""

        from django_debounce.backends import record
        from django_debounce.models import DebounceKey

        at = now or dbtime.now()
        rows = list(
            DebounceKey.objects.using(record.alias())
            .filter(store="redis", recheck_at__lte=at)
            .order_by("recheck_at")[:limit]
        )
        if not rows:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for row in rows:
            pipe.hmget(self.state_key(row.key_hash), "p", "ru", "d", "f")
        live = pipe.execute()
        rebuilt = 0
        options = registered_options()
        for row, (p, ru, d, f) in zip(rows, live, strict=True):
            if f is not None or p is not None:
                record.synced(row, int(p or 0), int(ru or 0), int(d or 0))
                continue
            if row.state == DebounceKey.State.IDLE:
                record.synced(row, 0, 0, 0)
                continue
            task_options = options.get(row.task_name, FlightOptions(wait=0.0))
            adopted = self.adopt(row.key_hash, row.task_name, task_options)
            if adopted:  # a flight of the previous release's layout: adopted, or after its run
                if adopted > 0:
                    record.rechecked(row, at)
                continue
            payload = (
                ""
                if row.payload is None
                else json.dumps(row.payload, separators=(",", ":"), ensure_ascii=False)
            )
            done = self._run(
                "restore",
                self.state_key(row.key_hash),
                [
                    _now(now),
                    *self._head(row.key_hash, row.task_name, task_options),
                    max(row.pending, 1),
                    row.flight_id,
                    _us(row.first_trigger_at) if row.first_trigger_at else 0,
                    _us(row.last_trigger_at) if row.last_trigger_at else 0,
                    _us(row.due_at) if row.due_at else 0,
                    payload if not task_options.collect else "",
                    f"{row.run_id},{row.triggers},{row.runs},{row.merged},{row.cancelled}",
                    int(row.state == DebounceKey.State.RUNNING),
                    short_key(row.key, row.task_name),
                ],
            )
            if int(done):
                rebuilt += 1
                logger.warning(
                    "django_debounce: the Redis state of %s %r was gone; its flight was rebuilt "
                    "from the durable record and runs again",
                    row.task_name,
                    row.key,
                )
            record.rechecked(row, at)
        return rebuilt

    # -- reading ----------------------------------------------------------------------------

    def live_state(self, key_hash):
        values = self.client.hmget(
            self.state_key(key_hash), "p", "f", "T", "R", "M", "C", "ru", "q", "r"
        )
        if all(v is None for v in values):
            return None
        p, f, t, r, m, c, ru, q, _run_id = (int(v or 0) for v in values)
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

    def live_rows(self, key_hashes):
        if not key_hashes:
            return {}
        fields = ("p", "f", "ft", "lt", "d", "ru", "T", "R", "M", "C", "lr", "lo", "r")
        pipe = self.client.pipeline(transaction=False)
        for h in key_hashes:
            pipe.hmget(self.state_key(h), *fields)
        out = {}
        for h, values in zip(key_hashes, pipe.execute(), strict=True):
            if all(v is None for v in values):
                continue
            p, f, ft, lt, d, ru, t, r, m, c, lr = (int(v or 0) for v in values[:11])
            if p and not lt:
                lt = ft
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
                "last_outcome": _s(values[11] or ""),
            }
        return out

    def pending_counts(self, key_hashes):
        if not key_hashes:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for h in key_hashes:
            pipe.hget(self.state_key(h), "p")
        return {h: int(p or 0) for h, p in zip(key_hashes, pipe.execute(), strict=True)}

    def index_stats(self, task_names=None):
        names = self._task_names(task_names)
        seconds, micros = self.client.time()
        at = int(seconds) * US + int(micros)
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            for shard in range(SHARDS):
                key = self.shard_prefix(shard) + "due:" + name
                pipe.zcard(key)
                pipe.zcount(key, "-inf", at)
                pipe.zrange(key, 0, 0, withscores=True)
        got = pipe.execute()
        out = {}
        for n, name in enumerate(names):
            depth = due = 0
            oldest = None
            for shard in range(SHARDS):
                base = (n * SHARDS + shard) * 3
                depth += int(got[base])
                due += int(got[base + 1])
                head = got[base + 2]
                if head:
                    score = int(head[0][1])
                    oldest = score if oldest is None else min(oldest, score)
            age = max(at - oldest, 0) / US if oldest is not None and oldest <= at else 0.0
            out[name] = IndexStats(depth=depth, due=due, oldest_due_age=age)
        return out

    def peek_state(self, key_hash: str) -> dict[str, str] | None:
        """The raw hash of ``key_hash`` (tests, ``debounce_status --key``)."""
        raw = self.client.hgetall(self.state_key(key_hash))
        return {_s(k): _s(v) for k, v in raw.items()} if raw else None
