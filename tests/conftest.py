"""Fixtures shared by the suite: one real Celery worker process group per session, polling
helpers with deadlines, and a clean broker.

Servers come from ``scripts/test`` (their URLs are in the environment); the worker is started
here, after the test database exists, and stopped at the end of the session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
from django.conf import settings

import tests.celery_app  # noqa: F401  (the app every task of the suite publishes through)

ROOT = Path(__file__).resolve().parent.parent


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float = 20.0,
    interval: float = 0.05,
    message: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def stays(predicate: Callable[[], Any], *, duration: float, interval: float = 0.05) -> bool:
    """True when ``predicate`` holds for the whole of ``duration`` seconds (checked by polling)."""
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(interval)
    return bool(predicate())


def flush_redis() -> None:
    """Empty the Redis of the cache alias and, in the Redis Cluster run
    (``DEBOUNCE_REDIS_CLUSTER``), every master of the cluster."""
    redis.Redis.from_url(settings.CACHES["default"]["LOCATION"]).flushdb()
    nodes = getattr(settings, "DEBOUNCE_REDIS_CLUSTER", None)
    if nodes:
        for node in nodes:
            host, _, port = node.rpartition(":")
            client = redis.Redis(host=host or "127.0.0.1", port=int(port))
            if client.info("replication").get("role") == "master":
                client.flushall()
            client.close()


@pytest.fixture(autouse=True)
def clean_redis_state() -> None:
    """Every test starts with an empty debounce state in Redis (the tables are flushed too)."""
    flush_redis()


@pytest.fixture(scope="session")
def broker() -> redis.Redis:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.ping()  # fail, do not skip, when Redis is not there
    return client


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


@pytest.fixture(scope="session")
def celery_worker_session(django_db_setup: Any, broker: redis.Redis) -> Iterator[Worker]:
    broker.flushdb()
    worker = Worker()
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def no_workers() -> Iterator[None]:
    """No Celery worker of this session runs during the module's tests: the running ones are
    stopped first and started again after the module.

    For tests that must be the only actor on the keys they drive, such as the property test,
    which drives the stores with a fake clock against a model: a worker's pump takes the due
    index entries of the tasks it knows at the real clock and with its own settings, at every
    tick (the session's worker stays up for the whole session once a test used it), and that
    test cannot tell such a step from a store bug."""
    stopped = sorted((w for w in Worker.live if w.running), key=lambda w: w.queue)
    for worker in stopped:
        worker.stop()
    try:
        yield
    finally:
        for worker in stopped:
            if not worker.running:
                worker.start()


STORES = ["redis", "database"]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[str]:
    """The conformance fixture: each test using it runs once per store (Redis, and the
    database under test: PostgreSQL or SQLite by ``DEBOUNCE_TEST_DB``)."""
    from django.test import override_settings

    with override_settings(DEBOUNCE_BACKEND=request.param):
        yield request.param


@pytest.fixture
def worker(celery_worker_session: Worker, store: str, transactional_db: Any) -> Iterator[Worker]:
    """A live worker and a database whose commits the worker sees (flushed after the test)."""
    yield celery_worker_session
    # Let runs started by this test end before the tables are flushed.
    from django_debounce.models import DebounceKey

    wait_for(
        lambda: not DebounceKey.objects.filter(state="running").exists(),
        timeout=30,
        message="runs of this test to finish",
    )
    # The records this test left for the recorder go with it: drained after the tables are
    # flushed, they would make rows in the next test's tables.
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    for name in list(client.scan_iter(match="*:rec", count=1000)):
        client.delete(name)


@pytest.fixture
def unique_tag(request: pytest.FixtureRequest) -> str:
    """A tag unique to this test, for keys that must not meet keys of other tests."""
    return f"{request.node.name}-{time.monotonic_ns()}"
