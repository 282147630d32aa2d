"""Fixtures shared by the suite: one real Celery worker process group per session, polling
helpers with deadlines, and a clean broker.

Servers come from ``scripts/test`` (their URLs are in the environment); the worker is started
here, after the test database exists, and stopped at the end of the session.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

import tests.celery_app  # noqa: F401  (the app every task of the suite publishes through)
from tests.support.helpers import flush_redis, wait_for
from tests.support.workers import Worker


def _flush_again_on_deadlock() -> None:
    """pytest-django empties the tables after a transactional test with Django's ``flush``
    (one ``TRUNCATE`` of every table, locked in its own order). The session's worker may be
    claiming a flight of the suite's receivers then (a test that saves an ``Item`` triggers
    one, whether or not it uses the worker): the claim locks the key row, then writes the run
    table, and PostgreSQL can pick the ``TRUNCATE`` as a deadlock's victim. Take it again
    (that claim has ended by then) until a deadline: after a test whose saves made many
    flights, the worker claims one after another, and the next ``TRUNCATE`` can be a
    victim too (PostgreSQL finds each deadlock after its ``deadlock_timeout``, 1 s)."""
    import time

    from django.core.management.base import CommandError
    from django.core.management.commands import flush

    handle = flush.Command.handle

    def handle_again(self: Any, **options: Any) -> Any:
        deadline = time.monotonic() + 120
        while True:
            try:
                return handle(self, **options)
            except CommandError as exc:
                deadlock = "deadlock detected" in str(exc.__cause__)
                if not deadlock or time.monotonic() > deadline:
                    raise

    flush.Command.handle = handle_again


_flush_again_on_deadlock()


@pytest.fixture(autouse=True)
def clean_redis_state() -> None:
    """Every test starts with an empty debounce state in Redis (the tables are flushed too).
    Without servers, a test outside tests/unit/ fails here (tests/unit/conftest.py overrides
    this fixture)."""
    if not settings.SERVERS:
        pytest.fail(settings.NO_SERVERS)
    flush_redis()


@pytest.fixture(scope="session")
def broker() -> redis.Redis:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.ping()  # fail, do not skip, when Redis is not there
    return client


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
    """The conformance fixture: each test using it runs once per store: the Redis store
    (counters in Redis over the rows) and the database store (rows only), on the database
    under test (PostgreSQL or SQLite by ``DEBOUNCE_TEST_DB``)."""
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


@pytest.fixture
def eager() -> Iterator[None]:
    """Celery's eager mode (``task_always_eager``): nothing is published, a trigger never runs
    the body; the test runs due flights with ``django_debounce.testing.run_due``."""
    app = tests.celery_app.app
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False


@pytest.fixture
def unique_tag(request: pytest.FixtureRequest) -> str:
    """A tag unique to this test, for keys that must not meet keys of other tests."""
    return f"{request.node.name}-{time.monotonic_ns()}"


# Tests whose behaviour depends on the database (marked ``every_db``): the stores on their
# own, the commands, the admin, and the worker tests of what SQLite makes special: pool
# processes forked again while the worker's threads tick (a killed or time-limited child), and
# several processes writing at once. The stores' real-time lodash cases with a worker and the
# Redis fault table are the database's only through the rows every other test covers.
EVERY_DB = (
    "tests/stores/",
    "tests/commands/",
    "tests/admin/",
    "tests/worker/test_give_up.py",
    "tests/worker/test_recovery.py",
    "tests/worker/test_invariants.py",
)
EVERY_DB_NOT = ("tests/stores/test_failover_properties.py",)
# The smoke subset (marked ``smoke``): what differs between Python, Django and Celery
# versions: the public API, the admin, the commands, the server-free tier, the stores' plain
# steps and bad input, without worker processes; and one end-to-end run on a real worker.
SMOKE = (
    "tests/api/",
    "tests/admin/",
    "tests/commands/",
    "tests/unit/",
    "tests/stores/test_store_semantics.py",
    "tests/stores/test_bad_input.py",
)
SMOKE_WITH_WORKER = ("tests/e2e/test_smoke.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses a real Celery worker (the ``worker`` fixture, the session's
    worker, or a module marked so) as ``worker``, and the subsets scripts/test runs beside the
    whole suite: ``every_db`` (on SQLite too) and ``smoke`` (the extra legs)."""
    root = config.rootpath
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        worker = bool(used & {"worker", "celery_worker_session"}) or bool(
            item.get_closest_marker("worker")
        )
        if worker:
            item.add_marker(pytest.mark.worker)
        path = item.path.relative_to(root).as_posix()
        in_stores = path.startswith("tests/stores/")
        if (
            path.startswith(EVERY_DB)
            and not path.startswith(EVERY_DB_NOT)
            and not (in_stores and worker)
        ):
            item.add_marker(pytest.mark.every_db)
        if (path.startswith(SMOKE) and not worker) or path.startswith(SMOKE_WITH_WORKER):
            item.add_marker(pytest.mark.smoke)
