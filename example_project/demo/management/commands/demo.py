"""``manage.py demo``: what django-debounce does to a burst of saves, against a real worker.

Starts a real Celery worker (prefork, 4 processes) as a subprocess, then runs four scenarios.
Each one saves one row of its own demo model many times in a row (real ``.save()`` calls, real
``post_save`` receivers, real broker messages); every job body sleeps 30 ms and records its run
in ``DemoRun``. The command waits for each scenario to settle (polling, with a deadline),
prints a table and exits non-zero when a property does not hold.

  a. task per save  a plain receiver queues one Celery task per save
  b. debounce       debounced_receiver(wait=0.05)
  c. coalesce       debounced_receiver(wait=0)              (no overlap: the default)
  d. stream         debounced_receiver(wait=0.05, max_wait=0.5) under saves every 10 ms for 2 s

The database and the broker are those of the settings: SQLite and a filesystem broker by
default, PostgreSQL and Redis when ``DATABASE_URL`` / ``CELERY_BROKER_URL`` point at them.
Run ``manage.py migrate`` first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from django_debounce.models import DebounceKey, DebounceRun
from example_project.demo import tasks as demo_tasks
from example_project.demo.models import (
    CoalesceDoc,
    DebounceDoc,
    DemoDoc,
    DemoRun,
    PerSaveDoc,
    StreamDoc,
)


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float,
    interval: float = 0.02,
    message: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; ``TimeoutError`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {message}")
        time.sleep(interval)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# -- the worker -------------------------------------------------------------------------------


class Worker:
    """A real ``celery -A example_project worker`` subprocess in a session of its own, so that
    stopping it reaches its pool processes too (this machine's PID 1 reaps no orphans)."""

    def __init__(self, *, concurrency: int, log: Path, ready_timeout: float) -> None:
        self.concurrency = concurrency
        self.log = log
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in = 0.0

    def start(self) -> None:
        root = Path(settings.BASE_DIR)
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="example_project.settings")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "wb")  # noqa: SIM115  (closed in stop())
        self._out = out
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "example_project",
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
                # No --purge: the queue may hold the catalogue's real work. Messages left by an
                # earlier demo are harmless: dispatch messages of deleted keys are dropped by the
                # store, and runs are counted per demo row (DemoRun.doc_pk).
                "--hostname",
                f"demo-{os.getpid()}@%h",
            ],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_for(
                self._ready,
                timeout=self.ready_timeout,
                interval=0.05,
                message="the Celery worker to be ready",
            )
        except TimeoutError as exc:
            raise CommandError(
                f"{exc} (is the broker reachable?). Last lines of {self.log}:\n{self.tail()}"
            ) from None
        self.started_in = time.monotonic() - t0

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise CommandError(
                f"The Celery worker exited with status {self.proc.returncode} before it was "
                f"ready. Last lines of {self.log}:\n{self.tail()}"
            )
        return b" ready." in self.log.read_bytes()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Warm shutdown (SIGTERM to the main process), then SIGKILL to the whole group."""
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # pool processes left behind, if any
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        finally:
            self._out.close()
            self.proc = None


# -- scenarios --------------------------------------------------------------------------------


@dataclass
class Scenario:
    letter: str
    name: str  # DemoRun.scenario
    title: str
    model: type[DemoDoc]
    task_name: str | None  # debounced task (None: plain Celery task per save)
    saves: int
    interval: float  # seconds between the starts of two saves
    expectation: str
    wait: float = 0.0


@dataclass
class Result:
    scenario: Scenario
    doc_pk: int | None = None
    saves: int = 0
    runs: list[DemoRun] = field(default_factory=list)
    first_save: float = 0.0
    last_save: float = 0.0  # time.time() just before the last .save() call
    last_save_done: float = 0.0
    settle_s: float = 0.0
    max_gap_s: float = 0.0  # longest pause between the starts of two consecutive saves
    error: str = ""
    failures: list[str] = field(default_factory=list)

    # derived facts

    @property
    def max_concurrent(self) -> int:
        events = sorted([(r.started, 1) for r in self.runs] + [(r.finished, -1) for r in self.runs])
        live = peak = 0
        for _t, delta in events:  # at equal times an end (-1) sorts before a start (+1)
            live += delta
            peak = max(peak, live)
        return peak

    @property
    def first_delay_ms(self) -> float | None:
        return (self.runs[0].started - self.first_save) * 1000 if self.runs else None

    @property
    def last_delay_ms(self) -> float | None:
        return (self.runs[-1].started - self.last_save) * 1000 if self.runs else None

    @property
    def final_applied(self) -> bool:
        return bool(self.runs) and self.runs[-1].version_seen == self.saves

    @property
    def triggers_covered(self) -> int | None:
        if self.scenario.task_name is None:
            return None
        return sum(r.triggers or 0 for r in self.runs)

    @property
    def passed(self) -> bool:
        return not self.error and not self.failures


SCENARIOS = [
    Scenario(
        "a",
        "per_save",
        "task per save",
        PerSaveDoc,
        None,
        saves=200,
        interval=0.002,
        expectation="one run per save (200), runs overlap (max concurrent > 1); the last run "
        "sees the final version",
    ),
    Scenario(
        "b",
        "debounce",
        "debounce wait=0.05",
        DebounceDoc,
        "demo.debounce",
        saves=200,
        interval=0.002,
        wait=demo_tasks.DEBOUNCE_WAIT,
        expectation="exactly 1 run, starting >= 50 ms after the last save, seeing the final "
        "version and covering all 200 saves",
    ),
    Scenario(
        "c",
        "coalesce",
        "coalesce wait=0",
        CoalesceDoc,
        "demo.coalesce",
        saves=200,
        interval=0.002,
        expectation="far fewer runs than saves (<= 50; a published reference measured 15), "
        "never overlapping; the last run starts after the last save and sees the final version",
    ),
    Scenario(
        "d",
        "stream",
        "stream + max_wait=0.5",
        StreamDoc,
        "demo.stream",
        saves=200,
        interval=0.01,
        wait=demo_tasks.STREAM_WAIT,
        expectation="a save every 10 ms for 2 s never leaves 50 ms of quiet, yet max_wait=0.5 "
        "gives about 4 runs (2..8), never overlapping; the last starts after the last save and "
        "sees the final version",
    ),
]


def check(result: Result) -> list[str]:
    """The properties each scenario demonstrates; returns the ones that do not hold."""
    s, runs, n = result.scenario, result.runs, result.saves
    out: list[str] = []
    if not runs:
        return ["no run at all"]
    if not result.final_applied:
        out.append(f"the last run saw version {runs[-1].version_seen}, not the final {n}")
    last_after = runs[-1].started > result.last_save
    if s.letter == "a":
        if len(runs) != n:
            out.append(f"{len(runs)} runs, expected one per save ({n})")
        if result.max_concurrent <= 1:
            out.append("runs never overlapped (expected max concurrent > 1)")
    else:
        covered = result.triggers_covered
        if covered != n:
            out.append(f"runs cover {covered} triggers in all, expected every save ({n})")
        if result.max_concurrent > 1:
            out.append(f"runs overlapped (max concurrent {result.max_concurrent}), overlap=False")
        if not last_after:
            out.append("the last run started before the last save")
    if s.letter == "b":
        if len(runs) != 1:
            out.append(f"{len(runs)} runs, expected exactly 1")
            if result.max_gap_s >= s.wait:
                out.append(
                    f"(the saves paused for {result.max_gap_s * 1000:.0f} ms, longer than "
                    "wait: a quiet period really happened; is the machine overloaded?)"
                )
        delay = runs[0].started - result.last_save
        if delay < s.wait:
            out.append(
                f"the run started {delay * 1000:.1f} ms after the last save, "
                f"before the quiet period of {s.wait * 1000:.0f} ms"
            )
    if s.letter == "c" and len(runs) > n // 4:
        out.append(f"{len(runs)} runs, expected far fewer than {n} (<= {n // 4})")
        planned, took = (n - 1) * s.interval, result.last_save_done - result.first_save
        if took > 2 * planned:
            out.append(
                f"(the saves took {took:.2f} s instead of {planned:.2f} s: the machine "
                "is busy, and a longer burst leaves room for more runs)"
            )
    if s.letter == "d" and not 2 <= len(runs) <= 8:
        out.append(f"{len(runs)} runs, expected about 4 (2..8)")
    return out


# -- the command ------------------------------------------------------------------------------


class Command(BaseCommand):
    help = (
        "Start a real Celery worker and show, with real model saves, how a burst of 200 saves "
        "is handled: one task per save, debounce, coalesce, and a stream bounded by max_wait. "
        "Exits non-zero when a shown property does not hold. Run `manage.py migrate` first."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency", type=int, default=4, help="worker processes (prefork pool); default 4"
        )
        parser.add_argument(
            "--settle-timeout",
            type=float,
            default=60.0,
            help="seconds each scenario may take to settle after its last save",
        )
        parser.add_argument(
            "--worker-timeout",
            type=float,
            default=60.0,
            help="seconds the worker may take to become ready",
        )
        parser.add_argument(
            "--only", default="abcd", help="scenarios to run, by letter (default: abcd)"
        )
        parser.add_argument(
            "--modes",
            action="store_true",
            help="instead of the scenarios, probe every mode of the mode table "
            "(docs/guide/modes.md: leading, throttle, collect, ...) with a burst, a stream and a "
            "save during a run",
        )
        parser.add_argument(
            "--worker-log",
            default=None,
            help="worker log file (default: example_project/var/demo-worker.log)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        t_total = time.monotonic()
        self._check_migrated()
        chosen = [s for s in SCENARIOS if s.letter in options["only"]]
        if not chosen:
            raise CommandError("--only selects no scenario; use letters among 'abcd'.")
        log = Path(
            options["worker_log"]
            or Path(settings.BASE_DIR) / "example_project" / "var" / "demo-worker.log"
        )
        self.stdout.write(self._describe(options["concurrency"]))
        worker = Worker(
            concurrency=options["concurrency"], log=log, ready_timeout=options["worker_timeout"]
        )
        results: list[Result] = []
        # SIGTERM/SIGHUP (a CI timeout, a closed terminal) unwind like Ctrl-C, so the worker
        # is stopped by the `finally` below instead of being left running in its own session.
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _raise_interrupt)
        try:
            self.stdout.write("Starting a Celery worker ...")
            worker.start()
            self.stdout.write(f"Worker ready in {worker.started_in:.1f} s (log: {log}).")
            if options["modes"]:
                self._modes(options["settle_timeout"], worker)
                return
            for scenario in chosen:
                self.stdout.write(
                    f"Running {scenario.letter}. {scenario.title}: {scenario.saves} "
                    f"saves every {scenario.interval * 1000:g} ms ..."
                )
                result = self._run(scenario, options["settle_timeout"], worker)
                results.append(result)
                self.stdout.write(
                    f"  saves took {result.last_save_done - result.first_save:.2f} s (longest "
                    f"pause {result.max_gap_s * 1000:.0f} ms); "
                    + (
                        f"settled {result.settle_s:.2f} s after the last save"
                        if not result.error
                        else result.error
                    )
                )
                if options["verbosity"] >= 2:
                    self.stdout.write(self._timeline(result))
        except KeyboardInterrupt as exc:
            raise CommandError(
                f"Interrupted ({exc or 'Ctrl-C'}); the worker was stopped."
            ) from None
        finally:
            worker.stop()
        self.stdout.write("")
        self.stdout.write(self._table(results))
        self.stdout.write(f"\nTotal {time.monotonic() - t_total:.1f} s.")
        failed = [r for r in results if not r.passed]
        if failed:
            if any(r.error for r in failed):
                self.stderr.write(f"Last lines of the worker log ({log}):\n{worker.tail()}")
            raise CommandError(
                f"{len(failed)} of {len(results)} scenarios failed: "
                + ", ".join(f"{r.scenario.letter}. {r.scenario.title}" for r in failed)
            )
        self.stdout.write(self.style.SUCCESS(f"All {len(results)} scenarios passed."))

    def _modes(self, settle_timeout: float, worker: Worker) -> None:
        from example_project.demo import modes_demo

        try:
            probes = modes_demo.run_all(settle_timeout, self.stdout.write)
        except TimeoutError as exc:
            raise CommandError(f"{exc}. Last lines of {worker.log}:\n{worker.tail()}") from None
        self.stdout.write("")
        self.stdout.write(modes_demo.table(probes))
        failed = [p for p in probes if p.problems]
        if failed:
            raise CommandError(f"{len(failed)} of {len(probes)} probes failed.")
        self.stdout.write(self.style.SUCCESS(f"All {len(probes)} probes passed."))

    # -- steps ----------------------------------------------------------------------------

    def _check_migrated(self) -> None:
        connection = connections[DEFAULT_DB_ALIAS]
        try:
            executor = MigrationExecutor(connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        except Exception as exc:  # noqa: BLE001  (any database error: say what to do)
            raise CommandError(f"Cannot read the database's migrations ({exc}).") from exc
        if plan:
            raise CommandError(
                f"The database is not migrated ({len(plan)} migrations to apply, e.g. "
                f"{plan[0][0].app_label}.{plan[0][0].name}). Run `python manage.py migrate` first."
            )
        # Migrated, but do the tables match the models? (A migration edited in place before a
        # release leaves an old schema behind that `migrate` does not change.)
        for model in (DebounceKey, DebounceRun, DemoRun, *(s.model for s in SCENARIOS)):
            try:
                list(model.objects.all()[:1])
            except DatabaseError as exc:
                raise CommandError(
                    f"The table of {model._meta.label} does not match its model ({exc}). The "
                    "database predates a change to a migration: recreate it (for the default "
                    "SQLite database, delete example_project/var/db.sqlite3) and run "
                    "`python manage.py migrate`."
                ) from exc

    def _describe(self, concurrency: int) -> str:
        db = settings.DATABASES[DEFAULT_DB_ALIAS]
        vendor = connections[DEFAULT_DB_ALIAS].vendor
        where = (
            db["NAME"]
            if vendor == "sqlite"
            else f"{db.get('HOST') or 'localhost'}:{db.get('PORT') or '5432'}/{db['NAME']}"
        )
        broker = settings.CELERY_BROKER_URL
        if broker.startswith("filesystem://"):
            broker = f"filesystem ({settings.CELERY_BROKER_TRANSPORT_OPTIONS['data_folder_in']})"
        elif "@" in broker:  # hide credentials
            scheme, rest = broker.split("://", 1)
            broker = f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
        return (
            f"django-debounce demo\n"
            f"  database: {vendor} ({where})\n"
            f"  broker:   {broker}\n"
            f"  worker:   celery prefork, concurrency {concurrency}; every job body sleeps "
            f"{demo_tasks.JOB_SECONDS * 1000:.0f} ms\n"
            f"  debounce backend: {getattr(settings, 'DEBOUNCE_BACKEND', 'auto')}"
        )

    def _clean(self, scenario: Scenario) -> None:
        DemoRun.objects.filter(scenario=scenario.name).delete()
        scenario.model.objects.all().delete()
        if scenario.task_name:
            DebounceKey.objects.filter(task_name=scenario.task_name).delete()

    def _run(self, scenario: Scenario, settle_timeout: float, worker: Worker) -> Result:
        self._clean(scenario)
        result = Result(scenario)
        # bulk_create sends no post_save: the row exists before the burst without a trigger.
        scenario.model.objects.bulk_create([scenario.model(version=0)])
        doc = scenario.model.objects.get()
        result.doc_pk = doc.pk

        start = time.perf_counter()
        previous = None
        for i in range(1, scenario.saves + 1):
            pause = start + (i - 1) * scenario.interval - time.perf_counter()
            if pause > 0:
                time.sleep(pause)  # pacing the saves, not synchronisation
            doc.version = i
            before = time.time()
            if previous is None:
                result.first_save = before
            else:
                result.max_gap_s = max(result.max_gap_s, before - previous)
            previous = before
            doc.save()
        result.last_save = before
        result.last_save_done = time.time()
        result.saves = scenario.saves

        try:
            wait_for(
                lambda: self._settled(scenario, doc.pk, worker),
                timeout=settle_timeout,
                message=f"scenario {scenario.letter} to settle",
            )
        except TimeoutError as exc:
            result.error = str(exc)
        result.settle_s = time.time() - result.last_save_done
        result.runs = list(
            DemoRun.objects.filter(scenario=scenario.name, doc_pk=doc.pk).order_by("started")
        )
        if not result.error:
            result.failures = check(result)
        return result

    def _settled(self, scenario: Scenario, doc_pk: int, worker: Worker) -> bool:
        if worker.proc is None or worker.proc.poll() is not None:
            raise CommandError(
                f"The Celery worker died. Last lines of {worker.log}:\n{worker.tail()}"
            )
        runs = DemoRun.objects.filter(scenario=scenario.name, doc_pk=doc_pk).count()
        if scenario.task_name is None:
            return runs >= scenario.saves
        # Settled when the key has nothing pending and no live run, and every claimed run has
        # recorded itself (DemoRun is written by the body, before the run's finish).
        key = DebounceKey.objects.filter(task_name=scenario.task_name).first()
        return (
            key is not None and key.pending == 0 and key.running_until is None and runs == key.runs
        )

    # -- output ---------------------------------------------------------------------------

    def _timeline(self, result: Result) -> str:
        """One line per run (verbosity 2): start and end after the first save, what it saw."""
        lines = []
        for n, run in enumerate(result.runs, 1):
            lines.append(
                f"    run {n:3d}: {(run.started - result.first_save) * 1000:7.1f} .. "
                f"{(run.finished - result.first_save) * 1000:7.1f} ms after the first save, "
                f"version {run.version_seen}"
                + (f", {run.triggers} triggers" if run.triggers is not None else "")
                + f", pid {run.pid}"
            )
        return "\n".join(lines) if lines else "    (no run)"

    def _table(self, results: list[Result]) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.0f}"

        headers = [
            "scenario",
            "saves",
            "runs",
            "max conc",
            "overlap",
            "1st run after 1st save ms",
            "last run after last save ms",
            "final version",
            "triggers in runs",
            "result",
        ]
        rows = []
        for r in results:
            rows.append(
                [
                    f"{r.scenario.letter}. {r.scenario.title}",
                    str(r.saves),
                    str(len(r.runs)),
                    str(r.max_concurrent),
                    "yes" if r.max_concurrent > 1 else "no",
                    ms(r.first_delay_ms),
                    ms(r.last_delay_ms),
                    "yes" if r.final_applied else "no",
                    "-" if r.triggers_covered is None else str(r.triggers_covered),
                    "PASS" if r.passed else "FAIL",
                ]
            )
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
        left = {0}

        def line(cells: list[str]) -> str:
            return "  ".join(
                c.ljust(w) if i in left else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        out = [line(headers), "  ".join("-" * w for w in widths)]
        out += [line(row) for row in rows]
        out.append("")
        for r in results:
            mark = "PASS" if r.passed else "FAIL"
            out.append(f"{r.scenario.letter}. [{mark}] expected: {r.scenario.expectation}")
            for problem in ([r.error] if r.error else []) + r.failures:
                out.append(f"     - {problem}")
        return "\n".join(out)
