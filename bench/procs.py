"""Processes the comparison benchmark starts and always stops: Redis servers of its own (the
broker's and the stats') and a Celery worker (prefork), each in its own process group."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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

    def __init__(self, env: dict[str, str], log: Path, concurrency: int = 4) -> None:
        self.env = env
        self.log = log
        self.concurrency = concurrency
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready) -> None:
        """Start the worker; ``ready()`` says when it is consuming (set by ``worker_ready``)."""
        out = open(self.log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker"]
            + ["--pool", "prefork", "--concurrency", str(self.concurrency)]
            + ["--loglevel", "WARNING", "--without-gossip", "--without-mingle"]
            + ["--without-heartbeat", "-Q", "bench", "-n", f"bench-{os.getpid()}@localhost"],
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
