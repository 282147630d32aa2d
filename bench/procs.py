"""Processes the benchmarks start and always stop: Redis servers of their own (the store's, the
broker's and the stats'), a PostgreSQL server at its default settings (``bench/scale.py``), and
Celery workers (prefork), each in its own process group; and CPU pinning of process trees."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class BenchError(RuntimeError):
    """A server or the worker could not start; the message says which and why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _wait(what: str, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"{what} did not come up within {timeout:.0f}s")
        time.sleep(0.1)


class RedisServer:
    """A non-persistent ``redis-server`` on a free loopback port."""

    def __init__(self, name: str, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise BenchError("redis-server is not installed (scripts/bench installs it)")
        self.name = name
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.directory / f"redis-{self.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + ["--appendonly", "no", "--dir", str(self.directory)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        _wait(f"redis ({self.name}) on port {self.port}", lambda: _pong(self.port), 20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class RedisCluster:
    """A 3-master Redis Cluster (no replicas), non-persistent, on free loopback ports, made as
    ``scripts/services.py`` makes the test suite's (``redis-cli --cluster create``)."""

    def __init__(self, directory: Path) -> None:
        self.svc: Any = _services()
        self.directory = directory / "cluster"
        ports = self.svc.Ports()
        self.nodes = [ports.cluster_node() for _ in range(self.svc.CLUSTER_NODES)]
        self.ports = [port for port, _bus in self.nodes]
        self.started = False

    @property
    def startup_nodes(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.ports]

    def start(self) -> None:
        self.directory.mkdir()
        self.started = True
        try:
            self.svc.start_cluster(str(self.directory), self.ports, [b for _p, b in self.nodes])
        except self.svc.ServiceError as exc:
            raise BenchError(f"the Redis Cluster did not start: {exc}") from None

    def pids(self) -> list[int]:
        out = []
        for port in self.ports:
            try:
                out.append(int((self.directory / f"cluster-{port}" / "redis.pid").read_text()))
            except (OSError, ValueError):
                pass
        return out

    def stop(self) -> None:
        if not self.started:
            return
        for port in self.ports:
            self.svc.stop_redis(str(self.directory / f"cluster-{port}" / "redis.pid"), port)
        self.started = False


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Worker:
    """``celery -A bench.celery_app worker`` (prefork) in a process group of its own."""

    def __init__(
        self,
        env: dict[str, str],
        log: Path,
        concurrency: int = 4,
        *,
        name: str | None = None,
        app: str = "bench.celery_app",
    ) -> None:
        self.env = env
        self.log = log
        self.concurrency = concurrency
        self.name = name or f"bench-{os.getpid()}@localhost"
        self.app = app
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready) -> None:
        """Start the worker; ``ready()`` says when it is consuming (set by ``worker_ready``)."""
        out = open(self.log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", self.app, "worker"]
            + ["--pool", "prefork", "--concurrency", str(self.concurrency)]
            + ["--loglevel", "WARNING", "--without-gossip", "--without-mingle"]
            + ["--without-heartbeat", "-Q", "bench", "-n", self.name],
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise BenchError(
                    f"the Celery worker exited with {self.proc.returncode}; see {self.log}:\n"
                    + self.log.read_text(errors="replace")[-3000:]
                )
            return bool(ready())

        _wait("the Celery worker", up, 60)

    def tree(self) -> list[int]:
        """The worker's main process and its pool processes."""
        if self.proc is None:
            return []
        pids, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo.extend(_children(pid))
        return pids

    def memory(self) -> dict[str, int]:
        """Peak resident memory (VmHWM, KiB) of the main process, the largest pool process,
        and the sum over the tree; current RSS of the tree."""
        pids = self.tree()
        main = pids[0] if pids else 0
        hwm = {pid: _status_kb(pid, "VmHWM") for pid in pids}
        return {
            "main_peak_kib": hwm.get(main, 0),
            "pool_peak_kib": max((v for p, v in hwm.items() if p != main), default=0),
            "tree_peak_kib": sum(hwm.values()),
            "tree_rss_kib": sum(_status_kb(pid, "VmRSS") for pid in pids),
        }

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:  # pool processes left behind (PID 1 here does not reap orphans)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        self.proc = None


# -- PostgreSQL at its default settings --------------------------------------------------------


def _services() -> object:
    """``scripts/services.py`` (stdlib only) as a module: its package check and helpers."""
    path = ROOT / "scripts" / "services.py"
    spec = importlib.util.spec_from_file_location("bench_services", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class PostgresServer:
    """A throwaway PostgreSQL 15 cluster on a free loopback port at its default settings: only
    ``listen_addresses``, the port and the socket directory are set (``extra`` adds settings,
    e.g. ``shared_preload_libraries``); fsync, synchronous_commit and the rest are as
    ``initdb`` leaves them. Runs as the ``postgres`` user when started by root."""

    def __init__(self, directory: Path, extra: dict[str, str] | None = None) -> None:
        self.svc: Any = _services()
        self.svc.ensure_packages()
        self.directory = directory
        self.port = free_port()
        self.extra = dict(extra or {})
        self.data = directory / "pg"
        self.started = False

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/debounce"

    @property
    def settings(self) -> dict[str, str]:
        return {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.directory / 'pgsock'}'",
            **self.extra,
        }

    def start(self) -> None:
        svc = self.svc
        sock, logfile = self.directory / "pgsock", self.directory / "pg.log"
        for path in (self.data, sock):
            path.mkdir(mode=0o700)
        logfile.touch()
        if svc.IS_ROOT:
            os.chmod(self.directory, 0o755)
            for path in (self.data, sock, logfile):
                os.chown(path, *svc.pg_ids())
        initdb = [f"{svc.PG_BIN}/initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust"]
        initdb += ["-E", "UTF8", "--locale=C.UTF-8"]
        svc.run(initdb, as_postgres=True)
        with open(self.data / "postgresql.conf", "a") as fh:
            fh.write("\n# bench/procs.py: defaults but for these\n")
            fh.writelines(f"{k} = {v}\n" for k, v in self.settings.items())
        svc.run(
            [f"{svc.PG_BIN}/pg_ctl", "-D", str(self.data), "-l", str(logfile), "-W", "start"],
            as_postgres=True,
        )
        self.started = True
        ready = [f"{svc.PG_BIN}/pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)]
        _wait("postgres", lambda: svc.run(ready, check=False).returncode == 0, 60)
        svc.run(
            [f"{svc.PG_BIN}/psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(self.port)]
            + ["-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1"]
            + ["-c", "CREATE DATABASE debounce"]
        )

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        if not self.started:
            return
        self.svc.run(
            [f"{self.svc.PG_BIN}/pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"],
            as_postgres=True,
            check=False,
        )
        self.started = False


# -- CPU placement --------------------------------------------------------------------------


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo.extend(_children(p))
    return pids


def pin_tree(pid: int, cpus: set[int] | None) -> None:
    """Pin ``pid`` and its descendants (and, through inheritance, their future children) to
    ``cpus``; ``None`` allows every CPU. Processes that went away meanwhile are skipped."""
    allowed = cpus if cpus is not None else set(range(os.cpu_count() or 1))
    for p in tree(pid):
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                os.sched_setaffinity(int(tid), allowed)
        except OSError:
            pass
