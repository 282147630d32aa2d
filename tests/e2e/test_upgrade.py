"""Upgrading a deployment of release 0.1 (git commit ``aafbd9f``) to this release, with real
processes of both (docs/design.md, "Upgrading from 0.1").

A small site of its own (written to a temporary directory: settings, a Celery app, one
collecting debounced task whose runs write which trigger ids they covered) runs first with
the 0.1 code first on its ``PYTHONPATH`` (``git archive aafbd9f django_debounce``), on a
database and a Redis of its own:

1. 0.1 alone: its migrations, a 0.1 worker running flights, then stopped; 0.1 web triggers
   leave countdown messages in the broker and flights in the 0.1 Redis layout
   (``debounce:{<hash>}``).
2. This release's migrations (0004-0006: they only add, so 0.1 keeps working on the tables).
3. A rolling deploy: a 0.1 worker and a new worker side by side, 0.1 and new web processes
   triggering the same keys; then the 0.1 processes stop and the new ones go on.

Every trigger carries a unique id; every run records the ids it covered. Nothing is lost
(each id is covered by a run that started after the trigger returned) and nothing runs
twice (each id in exactly one run).

The test needs the git history (commit ``aafbd9f``): without it, it fails and says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlparse

import pytest
import redis

from tests.support.helpers import ROOT, wait_for
from tests.support.servers import RedisServer

pytestmark = pytest.mark.worker

RELEASE_01 = "aafbd9f"
WAIT = 1.0

SETTINGS = """
import os
SECRET_KEY = "upgrade-test"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_debounce", "upapp"]
if os.environ["UPGRADE_DB"] == "postgresql":
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": os.environ["UPGRADE_DB_NAME"],
        "USER": os.environ["UPGRADE_DB_USER"], "HOST": os.environ["UPGRADE_DB_HOST"],
        "PORT": os.environ["UPGRADE_DB_PORT"]}}
else:
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["UPGRADE_DB_NAME"],
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;",
                    "timeout": 30}}}
REDIS = os.environ["UPGRADE_REDIS_URL"]
CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS + "/0"}}
CELERY_BROKER_URL = REDIS + "/1"
CELERY_TASK_DEFAULT_QUEUE = "upgrade"
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
DEBOUNCE_BACKEND = "redis"
DEBOUNCE_LEASE = 30
DEBOUNCE_DISPATCH_GRACE = 3
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "loggers": {"django_debounce": {"handlers": ["console"], "level": "INFO"}}}
"""

CELERY = """
import os
from celery import Celery
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "upsite.settings")
app = Celery("upsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.set_default()
app.autodiscover_tasks(["upapp"])
"""

MODELS = """
from django.db import models


class Ran(models.Model):
    tag = models.TextField()
    ids = models.JSONField()
    version = models.TextField()
    pid = models.IntegerField()
    started = models.FloatField()
    finished = models.FloatField(null=True)
"""

TASKS = f"""
import os
import time

from django_debounce import debounced_task


@debounced_task(wait={WAIT}, collect=True, name="upapp.rec", key=lambda item: item["tag"])
def rec(items, *, debounce):
    from upapp.models import Ran

    run = Ran.objects.create(
        tag=items[0]["tag"], ids=[i["id"] for i in items], version=os.environ["UPGRADE_AS"],
        pid=os.getpid(), started=time.time())
    time.sleep(0.2)
    run.finished = time.time()
    run.save(update_fields=["finished"])
"""

# A web process: triggers each (tag, id) of a JSON plan at its offset (seconds from its
# start) and writes when each trigger was made and when it returned.
WEB = """
import json, os, sys, time
import django
django.setup()
import upsite.celery  # noqa
from upapp.tasks import rec

plan = json.load(open(sys.argv[1]))
out = open(sys.argv[2], "a")
start = time.time()
for at, tag, ident in plan:
    time.sleep(max(0.0, start + at - time.time()))
    before = time.time()
    rec.trigger({"tag": tag, "id": ident})
    out.write(json.dumps([tag, ident, before, time.time()]) + "\\n")
    out.flush()
"""


def _write_site(site: Path) -> None:
    for path, text in {
        "upsite/__init__.py": "",
        "upsite/settings.py": SETTINGS,
        "upsite/celery.py": CELERY,
        "upapp/__init__.py": "",
        "upapp/models.py": MODELS,
        "upapp/tasks.py": TASKS,
        "web.py": WEB,
    }.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(textwrap.dedent(text))


def _release_01(into: Path) -> Path:
    """``django_debounce`` of release 0.1, extracted from git into ``into``."""
    has = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{RELEASE_01}^{{commit}}"],
        capture_output=True,
    )
    if has.returncode != 0:
        pytest.fail(
            f"the upgrade test needs release 0.1 (git commit {RELEASE_01}) from this "
            "repository's history, and this checkout does not have it (a shallow clone?). "
            "Run the suite from a full clone (git fetch --unshallow).",
            pytrace=False,
        )
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", RELEASE_01, "django_debounce"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    assert (into / "django_debounce" / "backends" / "lua" / "watch.lua").exists()
    return into


class Site:
    """The upgrade site's processes: ``old`` runs release 0.1, ``new`` this tree."""

    def __init__(self, tmp: Path, old: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.site = tmp / "site"
        _write_site(self.site)
        self.old = old
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.triggers = tmp / "triggers.jsonl"

    def environ(self, version: str) -> dict[str, str]:
        code = self.old if version == "old" else ROOT
        return {
            **os.environ,
            **self.env,
            "PYTHONPATH": f"{code}{os.pathsep}{self.site}",
            "DJANGO_SETTINGS_MODULE": "upsite.settings",
            "UPGRADE_AS": version,
        }

    def run(self, version: str, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, *args],
            cwd=self.site,
            env=self.environ(version),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert out.returncode == 0, f"{version} {args}:\n{out.stdout}\n{out.stderr}"
        code = self.old if version == "old" else ROOT
        check = subprocess.run(
            [sys.executable, "-c", "import django_debounce; print(django_debounce.__file__)"],
            cwd=self.site,
            env=self.environ(version),
            capture_output=True,
            text=True,
        )
        assert check.stdout.startswith(str(code)), (version, check.stdout, check.stderr)
        return out.stdout

    def worker(self, version: str, name: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"worker-{name}.log", "ab")  # noqa: SIM115
        offset = log.tell()
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "upsite.celery", "worker",
                "--pool", "prefork", "--concurrency", "2", "--loglevel", "INFO",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-Q", "upgrade", "--hostname", f"{name}@localhost",
            ],
            cwd=self.site,
            env=self.environ(version),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        path = self.tmp / f"worker-{name}.log"

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited:\n{path.read_text()[-3000:]}")
            return b"ready." in path.read_bytes()[offset:]

        wait_for(ready, timeout=60, interval=0.2, message=f"the {name} worker")
        return proc

    def web(self, version: str, plan: list[tuple[float, str, str]]) -> subprocess.Popen[bytes]:
        path = self.tmp / f"plan-{len(self.procs)}.json"
        path.write_text(json.dumps(plan))
        proc = subprocess.Popen(
            [sys.executable, "web.py", str(path), str(self.triggers)],
            cwd=self.site,
            env=self.environ(version),
            stdout=open(self.tmp / f"web-{len(self.procs)}.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen[bytes]) -> None:
        """A warm shutdown of a worker (its runs finish)."""
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                if os.getpgid(proc.pid) == proc.pid:  # a worker: its pool too
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
                proc.wait(timeout=30)

    def ran(self) -> list[dict]:
        out = self.run(
            "new",
            "-c",
            "import django, json; django.setup(); from upapp.models import Ran; "
            "print(json.dumps(list(Ran.objects.values())))",
        )
        return json.loads(out.strip().splitlines()[-1])

    def made(self) -> list[tuple[str, str, float, float]]:
        if not self.triggers.exists():
            return []
        return [tuple(json.loads(line)) for line in self.triggers.read_text().splitlines()]


def _plan(tags: list[str], rounds: int, every: float, prefix: str) -> list:
    return [(r * every, tag, f"{prefix}-{r}-{tag}") for r in range(rounds) for tag in tags]


@pytest.fixture
def database(tmp_path):
    """A database of the upgrade site's own: PostgreSQL (a new database on the suite's
    server) or SQLite, by ``DEBOUNCE_TEST_DB``."""
    vendor = os.environ.get("DEBOUNCE_TEST_DB", "postgresql")
    if vendor == "sqlite":
        yield {"UPGRADE_DB": "sqlite", "UPGRADE_DB_NAME": str(tmp_path / "upgrade.sqlite3")}
        return
    import psycopg

    pg = urlparse(os.environ["DEBOUNCE_TEST_POSTGRES_URL"])
    name = f"debounce_upgrade_{os.getpid()}"
    admin = dict(host=pg.hostname, port=pg.port, user=pg.username or "postgres", dbname="postgres")
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    yield {
        "UPGRADE_DB": "postgresql",
        "UPGRADE_DB_NAME": name,
        "UPGRADE_DB_USER": admin["user"],
        "UPGRADE_DB_HOST": pg.hostname,
        "UPGRADE_DB_PORT": str(pg.port),
    }
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_rolling_upgrade_from_release_01_loses_nothing_and_runs_nothing_twice(tmp_path, database):
    old = _release_01(tmp_path / "release-0.1")
    server = RedisServer(tmp_path)
    server.start()
    site = Site(tmp_path, old, {**database, "UPGRADE_REDIS_URL": server.url.rsplit("/", 1)[0]})
    client = redis.Redis.from_url(server.url)
    broker = redis.Redis.from_url(server.url.rsplit("/", 1)[0] + "/1")
    try:
        # 1. release 0.1 alone
        site.run("old", "-m", "django", "migrate", "--run-syncdb", "-v", "0")
        old_worker = site.worker("old", "old-1")
        first = site.web("old", _plan([f"a{i}" for i in range(4)], 3, 0.2, "a"))
        assert first.wait(timeout=60) == 0
        wait_for(lambda: len(site.ran()) >= 4, timeout=30, message="0.1 runs")
        site.stop(old_worker)
        # 0.1 triggers while no worker runs: countdown messages wait in the broker, flights in
        # the 0.1 layout
        pending = site.web("old", _plan([f"b{i}" for i in range(4)], 2, 0.2, "b"))
        assert pending.wait(timeout=60) == 0
        assert client.keys("debounce:{*}"), "no 0.1 Redis layout"
        assert broker.llen("upgrade") >= 4, "no 0.1 countdown messages in the broker"
        # 2. this release's migrations (they only add)
        site.run("new", "-m", "django", "migrate", "-v", "0")
        # 3. a rolling deploy: 0.1 and new side by side, web processes of both kinds
        # (the new worker first: it receives the 0.1 countdown messages and adopts their
        # flights; then a 0.1 worker joins it)
        new_worker = site.worker("new", "new-1")
        old_worker = site.worker("old", "old-2")
        shared = [f"c{i}" for i in range(4)] + [f"b{i}" for i in range(2)]
        webs = [
            site.web("old", _plan(shared, 10, 0.3, "c-old")),
            site.web("new", _plan(shared, 10, 0.3, "c-new")),
        ]
        for web in webs:
            assert web.wait(timeout=90) == 0
        site.stop(old_worker)
        last = site.web("new", _plan(shared + [f"d{i}" for i in range(2)], 4, 0.3, "d"))
        assert last.wait(timeout=60) == 0
        # every trigger covered by a run that started after it returned (recheck: 15 s)
        made = site.made()
        assert len(made) == 4 * 3 + 4 * 2 + 2 * 6 * 10 + 8 * 4

        def covered() -> list:
            ran = site.ran()
            started = {}
            for run in ran:
                for ident in run["ids"]:
                    started.setdefault(ident, []).append(run["started"])
            missing = [m for m in made if not any(s >= m[3] for s in started.get(m[1], []))]
            return [] if missing else ran

        ran = wait_for(covered, timeout=60, interval=1.0, message="every trigger covered")
        site.stop(new_worker)
        seen: dict[str, list] = {}
        for run in ran:
            for ident in run["ids"]:
                seen.setdefault(ident, []).append((run["version"], run["tag"], run["started"]))
        twice = {ident: runs for ident, runs in seen.items() if len(runs) > 1}
        assert not twice, f"triggers run twice: {twice}"
        assert set(seen) == {m[1] for m in made}
        versions = {run["version"] for run in ran}
        assert versions == {"old", "new"}, versions
        # the new release adopted 0.1 flights into its layout: what is left of the 0.1 layout
        # holds nothing pending
        assert client.keys("debounce{*"), "the new layout was never used"
        for name in client.keys("debounce:{*}"):
            assert int(client.hget(name, "p") or 0) == 0, (name, client.hgetall(name))
        adopted = [
            r for r in ran if r["version"] == "new" and any(i.startswith("b-") for i in r["ids"])
        ]
        assert adopted, "no flight of 0.1 (made before the upgrade) was run by the new release"
        print("runs by version:", {v: sum(r["version"] == v for r in ran) for v in versions})
    finally:
        site.close()
        server.stop()
