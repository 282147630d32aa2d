"""``Worker``: a real ``celery worker`` (prefork) subprocess running the test app's tasks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

from tests.support.helpers import ROOT, wait_for


class Worker:
    """A real ``celery worker`` (prefork) subprocess running the test app's tasks."""

    # The workers of this session that were started and not stopped since (``no_workers``).
    live: ClassVar[set[Worker]] = set()

    def __init__(
        self,
        concurrency: int = 4,
        queue: str = "debounce-tests",
        env: dict[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.queue = queue
        self.env = env or {}
        self.name = name or queue  # the node name's first part (distinct for several workers)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = (
            Path(os.environ.get("TMPDIR", "/tmp"))
            / f"debounce-worker-{self.name}-{os.getpid()}.log"
        )

    def start(self) -> None:
        # The worker runs the auto store, which routes every message to the store that
        # issued it, so one worker serves tests of every store.
        env = {
            **os.environ,
            "DEBOUNCE_TEST_WORKER": "1",
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
            "DEBOUNCE_TEST_BACKEND": "auto",
            **self.env,  # a test's worker may override any of these
        }
        self._out = open(self.log, "ab")  # noqa: SIM115
        # The log file is shared by every start of a worker of this queue in this session:
        # only a "ready." written after this start counts (a restart must wait for its own).
        self._log_from = os.path.getsize(self.log)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.celery_app",
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                str(self.concurrency),
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-Q",
                self.queue,
                "--hostname",
                f"{self.name}-{os.getpid()}@localhost",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        Worker.live.add(self)
        wait_for(self._ready, timeout=60, interval=0.2, message="the Celery worker to be ready")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"Celery worker exited with {self.proc.returncode}; see {self.log}:\n"
                + self.log.read_text()[-3000:]
            )
        with open(self.log, "rb") as log:
            log.seek(self._log_from)
            return b"ready." in log.read()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes: runs in progress die mid-body."""
        assert self.proc is not None
        Worker.live.discard(self)
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._out.close()

    def stop(self) -> None:
        Worker.live.discard(self)
        if not self.running:
            return
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._out.close()
