"""A Redis server a test can stop and start (the suite's shared servers come from scripts/test)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from tests.support.helpers import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """``redis-server`` on a loopback port. Without ``persistent`` a restart starts empty;
    with it, every write is in the append-only file before Redis answers (``appendonly yes``,
    ``appendfsync always``), so a restart after ``stop()`` (SIGKILL) keeps every write that was
    answered, and ``wipe()`` (while stopped) makes the next start empty."""

    def __init__(
        self, directory: Path, *, persistent: bool = False, args: tuple[str, ...] = ()
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; run the suite with scripts/test")
        self.binary = binary
        self.directory = directory
        self.persistent = persistent
        self.args = args  # more redis-server options (``--replicaof``, ...)
        self.port = free_port()
        self.paused = False
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always", "--appenddirname", "aof"]
            if self.persistent
            else ["--appendonly", "no"]
        )
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                *persistence,
                "--dir",
                str(self.directory),
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: _pong(self.port), timeout=20, message=f"redis on {self.port}")

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open, nothing is answered until ``resume()``
        (commands sent meanwhile run when it resumes, late)."""
        assert self.proc is not None and self.running and not self.paused
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT a paused server."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False
        wait_for(lambda: _pong(self.port), timeout=20, message=f"redis on {self.port} to resume")

    def stop(self) -> None:
        self.paused = False  # SIGKILL ends a stopped process too
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        wait_for(lambda: not _pong(self.port), timeout=10, message="redis to stop")

    def wipe(self) -> None:
        """Delete the append-only file (the server must be stopped): the next start is empty."""
        assert not self.running, "wipe() needs a stopped server"
        shutil.rmtree(self.directory / "aof", ignore_errors=True)
