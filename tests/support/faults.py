"""A Redis server of a test's own that the test breaks on purpose (stopped, restarted empty,
flushed, out of memory, read-only, evicting, paused), and the Redis store on it
(tests/stores/test_failover_properties.py).

``store_on`` builds a ``RedisBackend`` whose redis-py client has a socket timeout and no
retries (a call to a stopped or paused Redis fails within the timeout, as a deployment
configures it), and whose scripts may run in a **Redis clock** of the test's choosing: with
a fake clock, the store gives the scripts the step's fake time; ``RedisClock`` gives them
that time plus an offset instead (``open``: the fake clock when it runs, which may be after
its step), as a Redis whose clock is the test's, ``offset`` microseconds ahead of the
database's. The scripts themselves run unchanged on the real server.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_debounce.backends.redis import RedisBackend
from tests.support.helpers import wait_for
from tests.support.servers import RedisServer

# where each script takes its "now" argument (ARGV index from 0)
NOW_ARG = {"merge": 1, "open": 5, "seal": 2}


def client_of(url: str, timeout: float = 1.0, retries: int = 0) -> redis.Redis:
    """A redis-py client that gives up after ``timeout`` seconds (and ``retries`` retries)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), retries),
    )


class RedisClock:
    """The time the scripts get: ``now()`` (the test's fake clock, integer microseconds)
    plus ``offset``; ``None`` from ``now`` leaves the store's arguments alone."""

    def __init__(self, now: Callable[[], int | None], offset: int = 0) -> None:
        self.now = now
        self.offset = offset
        self.calls: dict[str, int] = {"merge": 0, "open": 0, "seal": 0}


class ClockedScript:
    """A registered script called with the Redis clock's time as its ``now`` argument: in a
    pipeline (``client`` given) here, else by its client's ``evalsha`` (``clocked``), which
    the store calls directly."""

    def __init__(self, name: str, script: Any, clock: RedisClock) -> None:
        self.name = name
        self.script = script
        self.sha = script.sha
        self.clock = clock

    def timed(self, args: Any) -> list[Any]:
        """``args`` with the Redis clock's time as the script's ``now``; counts the call."""
        args = list(args or [])
        i = NOW_ARG[self.name]
        self.clock.calls[self.name] += 1
        fake = self.clock.now()
        if fake is not None:
            # merge and seal run within the step whose fake time the store gives them; an
            # open runs after the step committed, maybe late: Redis's clock is the test's
            # fake clock when it runs
            base = int(args[i]) if args[i] != "" and self.name != "open" else fake
            args[i] = str(base + self.clock.offset)
        return args

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        if client is None:  # through the client's evalsha, which gives the time
            return self.script(keys=keys, args=args)
        return self.script(keys=keys, args=self.timed(args), client=client)


def clocked(client: redis.Redis, scripts: dict[str, ClockedScript]) -> None:
    """Make ``client.evalsha`` give ``scripts`` the Redis clock's time."""
    by_sha = {script.sha: script for script in scripts.values()}
    plain = client.__dict__.setdefault("plain_evalsha", client.evalsha)  # one clock per client

    def evalsha(sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        script = by_sha.get(sha)
        if script is not None:
            args = script.timed(keys_and_args[numkeys:])
            keys_and_args = (*keys_and_args[:numkeys], *args)
        return plain(sha, numkeys, *keys_and_args)

    client.evalsha = evalsha  # type: ignore[method-assign]


def store_on(
    client: redis.Redis, clock: RedisClock | None = None, cls: type[RedisBackend] = RedisBackend
) -> RedisBackend:
    """A Redis store (``cls``) talking to Redis through ``client``, its scripts in
    ``clock``'s time when given, trying Redis at every step (no back-off)."""
    backend = cls()
    # every step tries Redis again (no back-off after a failure), so a fault begins and
    # ends exactly where the test puts it
    backend.BACKOFF = 0.0  # type: ignore[attr-defined]
    use(backend, client, clock)
    return backend


def use(backend: RedisBackend, client: redis.Redis, clock: RedisClock | None) -> None:
    """Point ``backend`` at ``client`` (its scripts registered there)."""
    backend.__dict__["client"] = client
    backend.__dict__.pop("scripts", None)
    scripts = RedisBackend.scripts.func(backend)  # type: ignore[attr-defined]
    client.__dict__.pop("evalsha", None)  # the clock of an earlier use() goes
    if clock is not None:
        scripts = {name: ClockedScript(name, s, clock) for name, s in scripts.items()}
        clocked(client, scripts)
    backend.__dict__["scripts"] = scripts


class FaultyRedis:
    """A ``redis-server`` (not persistent: a restart starts empty) and the faults a test
    puts on it. ``admin`` never breaks with it (it reconnects; its own timeout)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.server = RedisServer(directory)
        self.server.start()
        self.admin = client_of(self.server.url, timeout=5.0, retries=3)
        self.replica: RedisServer | None = None
        self.state = "up"  # up, down, oom, readonly, paused, lru

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, timeout: float = 1.0) -> redis.Redis:
        return client_of(self.server.url, timeout)

    # -- faults ---------------------------------------------------------------------------

    def stop(self) -> None:
        """SIGKILL: connections are refused until ``start()``."""
        self.server.stop()
        self.state = "down"

    def start(self) -> None:
        """Start again, empty (a restart that lost everything)."""
        if not self.server.running:
            self.server.start()
        self.state = "up"

    def pause(self) -> None:
        self.server.pause()
        self.state = "paused"

    def resume(self) -> None:
        self.server.resume()
        self.state = "up"

    def out_of_memory(self) -> None:
        """Every write (but a script flagged ``allow-oom``) is refused with ``OOM``."""
        self.admin.config_set("maxmemory-policy", "noeviction")
        self.admin.config_set("maxmemory", 1)
        self.state = "oom"

    def evicting(self, room: int) -> None:
        """``allkeys-lru`` with ``room`` bytes above what Redis uses now: keys are evicted
        as writes fill it."""
        used = int(self.admin.info("memory")["used_memory"])
        self.admin.config_set("maxmemory-policy", "allkeys-lru")
        self.admin.config_set("maxmemory", used + room)
        self.state = "lru"

    def evicted(self) -> int:
        return int(self.admin.info("stats")["evicted_keys"])

    def replica_client(self, timeout: float = 1.0) -> redis.Redis:
        """A client of a read-only replica of this server, in sync with it now (started on
        first use)."""
        if self.replica is None or not self.replica.running:
            (self.directory / "replica").mkdir(exist_ok=True)
            self.replica = RedisServer(
                self.directory / "replica",
                args=("--replicaof", "127.0.0.1", str(self.server.port)),
            )
            self.replica.start()
        replica = client_of(self.replica.url, timeout=5.0)

        def synced() -> bool:
            mine = self.admin.info("replication")
            theirs = replica.info("replication")
            return theirs.get("master_link_status") == "up" and theirs.get(
                "slave_repl_offset"
            ) == mine.get("master_repl_offset")

        wait_for(synced, timeout=20, message="the replica to sync")
        replica.close()
        self.state = "readonly"
        return client_of(self.replica.url, timeout)

    def heal(self) -> None:
        """Up, answering, taking writes (its data kept unless it was down)."""
        if self.server.paused:
            self.server.resume()
        if not self.server.running:
            self.server.start()
        self.admin.config_set("maxmemory", 0)
        self.admin.config_set("maxmemory-policy", "noeviction")
        self.state = "up"

    def reset(self) -> None:
        """Healed and empty, its statistics zeroed."""
        self.heal()
        self.admin.flushall()
        self.admin.config_resetstat()

    def close(self) -> None:
        if self.server.paused:
            self.server.resume()
        self.server.stop()
        if self.replica is not None:
            self.replica.stop()
