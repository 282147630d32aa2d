"""Runs every ```python sample of README.md and the manual (docs/**/*.md) for real, in this one
process, and reports per-sample results as JSON (tests/unit/test_docs_samples.py starts it).

    python tests/unit/docs_samples_runner.py [--json OUT] [--tmp DIR]

The samples are written as in a user's project whose app is ``catalogue``: here that is the
example project's ``example_project.catalogue``, aliased as ``catalogue`` in ``sys.modules``
(the same module objects, so the models are imported once). Django runs with
``example_project.settings`` on a fresh SQLite file under ``--tmp`` (migrated first) and
kombu's in-memory broker; Celery runs eagerly (``task_always_eager``), so triggers stay
pending until ``django_debounce.testing.run_due()``, as docs/testing.md describes. Before the
samples, Category 42 and Product 42 (the ids the samples use) are created.

Each sample runs as a module of its own (a fresh namespace), statement by statement so that
the value of each top-level expression can be checked, with tracebacks pointing at the
Markdown file and line. Then what it shows is checked:

- a settings fragment (only ``UPPER_CASE = ...``): every name is a Django, Celery or
  django-debounce setting; ``LOGGING`` is accepted by ``logging.config.dictConfig``;
  each ``CELERY_BEAT_SCHEDULE`` entry is applied by Celery beat's own scheduler;
- ``@debounced_task``/``@debounced_receiver``: the name is a registered ``DebouncedTask``;
  a receiver's model is saved, the flight run, and the receiver's run must succeed;
- a top-level ``.trigger(...)`` returns a counted ``TriggerResult``, ``trigger_many(...)`` a
  list of them, ``.flush(...)`` ``True`` (it ran a pending flight), ``.cancel(...)`` an int,
  ``.delay()``/``.apply_async()`` a successful result;
- an ``AdminSite`` the sample builds registers the debounce models (with the summary page);
- an ``AppConfig`` subclass is instantiated and its ``ready()`` called; an ``async def`` view
  ``(request, ...)`` is called with a request (and 42 for each other argument) and must
  answer 200; a ``test_*`` function is called with the pytest fixtures it names
  (``settings``, ``monkeypatch``, ``db``: a transaction rolled back afterwards);
- a receiver of a django-debounce signal is exercised by one run of a catalogue task, and a
  logger the sample defines must have logged from it;
- messages a sample publishes (``send_task`` ignores eager mode) are run as a worker would,
  then every pending flight is run (``run_due`` an hour ahead); nothing may be logged at
  ERROR meanwhile (signal receivers' errors are only logged).

A block preceded by ``<!-- sample: not run (reason) -->`` is reported as skipped.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import copy
import importlib
import io
import json
import logging
import logging.config
import os
import pkgutil
import re
import sys
import tempfile
import traceback
import types
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
PYTHON = re.compile(r"^\s*(?:python3?|py)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*sample:\s*not run\s*\((?P<reason>.+)\)\s*-->\s*$")
# Read by Celery's Django fix-up (celery/fixups/django.py), not a key of Celery's defaults.
CELERY_FIXUP_SETTINGS = {"CELERY_DB_REUSE_MAX"}


@dataclass
class Sample:
    path: str  # relative to the repository
    line: int  # 1-based line of the opening fence
    code: str
    not_run: str | None = None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def markdown_files(root: Path = ROOT) -> list[Path]:
    docs = sorted(p for p in (root / "docs").rglob("*.md") if "_build" not in p.parts)
    return [root / "README.md", *docs]


def find_samples(root: Path = ROOT) -> list[Sample]:
    """Every fenced block whose info string is ``python`` (or ``py``), in file order."""
    samples = []
    for path in markdown_files(root):
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            opening = FENCE.match(lines[i])
            if not opening:
                i += 1
                continue
            indent, fence = opening["indent"], opening["fence"]
            end = i + 1
            while end < len(lines):
                closing = FENCE.match(lines[end])
                if (
                    closing
                    and closing["fence"][0] == fence[0]
                    and len(closing["fence"]) >= len(fence)
                    and not closing["info"].strip()
                ):
                    break
                end += 1
            if PYTHON.match(opening["info"]):
                body = [
                    ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : end]
                ]
                mark = NOT_RUN.match(next((ln for ln in reversed(lines[:i]) if ln.strip()), ""))
                samples.append(
                    Sample(
                        path=str(path.relative_to(root)),
                        line=i + 1,
                        code="\n".join(body) + "\n",
                        not_run=mark["reason"].strip() if mark else None,
                    )
                )
            i = end + 1
    return samples


# -- the environment ------------------------------------------------------------------------


def set_up(tmp: Path) -> Any:
    """Django on the example project's settings with a fresh, migrated SQLite file; Celery
    eager; ``catalogue`` aliased; the rows the samples name. Returns the Celery app."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp.resolve() / 'db.sqlite3'}"
    os.environ["CELERY_BROKER_URL"] = "memory://"  # a real kombu transport, in this process
    for name in ("REDIS_URL", "CATALOGUE_SEARCH_WAIT", "CATALOGUE_STATS_WAIT"):
        os.environ.pop(name, None)  # the example's defaults: database store, 2 s and 5 s
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    sys.path.insert(0, str(ROOT))

    import django

    django.setup()
    import django_debounce

    if not Path(django_debounce.__file__).resolve().is_relative_to(ROOT):
        raise RuntimeError(f"django_debounce imported from {django_debounce.__file__}, not {ROOT}")

    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)

    from example_project.celery import app

    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True

    import example_project.catalogue as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    for name, module in list(sys.modules.items()):
        if name == package.__name__ or name.startswith(package.__name__ + "."):
            sys.modules["catalogue" + name[len(package.__name__) :]] = module

    from example_project.catalogue.models import Category, Product

    lighting = Category.objects.create(pk=42, name="lighting")
    Product.objects.create(pk=42, name="lamp", price="30.00", category=lighting)
    run_pending()
    return app


def run_pending() -> int:
    """Run every pending flight (``run_due`` an hour ahead: every wait has passed)."""
    from django.utils import timezone

    from django_debounce.testing import run_due

    return run_due(now=timezone.now() + timedelta(hours=1))


def run_published(app: Any) -> list[str]:
    """Run the messages published to the broker as a worker would (``send_task`` ignores
    ``task_always_eager``); returns the task names."""
    ran = []
    queue = app.amqp.queues[app.conf.task_default_queue]
    with app.connection_for_read() as conn, conn.SimpleQueue(queue, no_ack=True) as simple:
        while True:
            try:
                message = simple.get(block=False)
            except simple.Empty:
                break
            name = message.headers["task"]
            args, kwargs, _embed = message.decode()
            app.tasks[name].apply(args=args, kwargs=kwargs, task_id=message.headers["id"]).get()
            ran.append(name)
    return ran


class Records(logging.Handler):
    """Every record at INFO and above, with its message formatted (a failure is kept)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            record.text = record.getMessage()
        except Exception as exc:  # a wrong format string or argument
            record.text = f"<cannot format {record.msg!r} % {record.args!r}: {exc!r}>"
            record.levelno, record.levelname = logging.ERROR, "ERROR"
        self.records.append(record)


class SettingsFixture:
    """What pytest-django's ``settings`` fixture does: each assignment is an
    ``override_settings``, undone by ``finalize()``."""

    def __init__(self) -> None:
        object.__setattr__(self, "_overrides", [])

    def __setattr__(self, name: str, value: Any) -> None:
        from django.test import override_settings

        override = override_settings(**{name: value})
        override.enable()
        self._overrides.append(override)

    def __getattr__(self, name: str) -> Any:
        from django.conf import settings

        return getattr(settings, name)

    def finalize(self) -> None:
        for override in reversed(self._overrides):
            override.disable()


# -- one sample ---------------------------------------------------------------------------


class Runner:
    def __init__(self, app: Any, records: Records) -> None:
        from django.db.models import signals as model_signals

        from django_debounce import signals as debounce_signals

        self.app = app
        self.records = records
        self.debounce_signals = [
            debounce_signals.trigger_received,
            debounce_signals.run_started,
            debounce_signals.run_finished,
        ]
        self.signals = [
            model_signals.pre_save,
            model_signals.post_save,
            model_signals.pre_delete,
            model_signals.post_delete,
            model_signals.m2m_changed,
            *self.debounce_signals,
        ]

    def run(self, sample: Sample) -> dict[str, Any]:
        result: dict[str, Any] = {"id": sample.id, "path": sample.path, "line": sample.line}
        if sample.not_run:
            return {**result, "ok": True, "skipped": sample.not_run, "checks": []}
        name = "docs_sample_" + re.sub(r"\W", "_", sample.id)
        module = types.ModuleType(name)
        module.__file__ = str(ROOT / sample.path)
        sys.modules[name] = module
        receivers = {sig: list(sig.receivers) for sig in self.signals}
        first_record = len(self.records.records)
        checks: list[str] = []
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                tree = ast.parse(sample.code, filename=module.__file__)
                ast.increment_lineno(tree, sample.line)
                values = execute(tree, module.__dict__, module.__file__)
                self.verify(tree, module.__dict__, values, receivers, checks)
            result["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
            errors = [r for r in self.records.records[first_record:] if r.levelno >= logging.ERROR]
            if errors:
                raise AssertionError(
                    "logged at ERROR: " + "; ".join(f"{r.name}: {r.text}" for r in errors)
                )
            result.update(ok=True, error=None)
        except BaseException:
            result.update(ok=False, error=traceback.format_exc())
        finally:
            for sig, before in receivers.items():
                with sig.lock:
                    sig.receivers = before
                    sig.sender_receivers_cache.clear()
            del sys.modules[name]
        result.update(checks=checks, output=output.getvalue())
        return result

    def verify(
        self,
        tree: ast.Module,
        ns: dict[str, Any],
        values: list[tuple[ast.expr, Any]],
        receivers: dict[Any, list[Any]],
        checks: list[str],
    ) -> None:
        from django.apps import AppConfig
        from django.contrib.admin import AdminSite
        from django.contrib.admin import site as admin_site

        from django_debounce import registry
        from django_debounce.receivers import DebouncedReceiverTask
        from django_debounce.tasks import DebouncedTask

        if tree.body and all(settings_name(stmt) for stmt in tree.body):
            self.verify_settings(tree, ns, checks)

        defined_receivers = []
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef) and any(
                decorator_name(d) in ("debounced_task", "debounced_receiver")
                for d in stmt.decorator_list
            ):
                task = ns[stmt.name]
                assert isinstance(task, DebouncedTask), f"{stmt.name} is not a DebouncedTask"
                registered = registry.get(task.name)
                assert registered is task._get_current_object(), f"{task.name} not registered"
                kind = "receiver" if isinstance(task, DebouncedReceiverTask) else "task"
                checks.append(f"{stmt.name}: a registered debounced {kind} ({task.name})")
                if isinstance(task, DebouncedReceiverTask):
                    defined_receivers.append(task)

        for call, value in values:
            checks.extend(check_value(call, value))

        for name, obj in ns.items():
            if isinstance(obj, AdminSite) and obj is not admin_site:
                checks.append(check_admin_site(name, obj))

        for stmt in tree.body:
            obj = ns.get(getattr(stmt, "name", ""))
            if isinstance(stmt, ast.ClassDef) and isinstance(obj, type):
                if issubclass(obj, AppConfig):
                    config = obj(obj.name, importlib.import_module(obj.name))
                    config.ready()
                    checks.append(f"{stmt.name}({obj.name!r}).ready() ran")
            elif isinstance(stmt, ast.AsyncFunctionDef) and stmt.args.args[:1]:
                if stmt.args.args[0].arg == "request":
                    checks.append(call_view(obj, len(stmt.args.args) - 1))
            elif isinstance(stmt, ast.FunctionDef) and stmt.name.startswith("test_"):
                checks.append(call_test(obj, [a.arg for a in stmt.args.args]))

        listeners = [
            r for sig in self.debounce_signals for r in sig.receivers if r not in receivers[sig]
        ]
        if listeners:
            checks.append(self.probe_signal_receivers(ns))
        for task in defined_receivers:
            checks.append(self.probe_receiver(task))

        ran = run_published(self.app)
        if ran:
            checks.append(f"published messages ran as in a worker: {', '.join(ran)}")
        pending = run_pending()
        if pending:
            checks.append(f"{pending} pending flight(s) ran")

    def verify_settings(self, tree: ast.Module, ns: dict[str, Any], checks: list[str]) -> None:
        names = [settings_name(stmt) for stmt in tree.body]
        unknown = [n for n in names if not known_setting(n)]
        assert not unknown, f"not a Django, Celery or django-debounce setting: {unknown}"
        checks.append(f"known settings: {', '.join(names)}")
        if "LOGGING" in ns:
            config = copy.deepcopy(ns["LOGGING"])
            names = ["", *config.get("loggers", {})]
            loggers = [logging.getLogger(n) for n in names]
            saved = [(lg.level, lg.propagate, lg.disabled, lg.handlers[:]) for lg in loggers]
            try:
                logging.config.dictConfig(config)
            finally:  # the next samples run with the logging they started with
                for lg, (level, propagate, disabled, handlers) in zip(loggers, saved, strict=True):
                    lg.setLevel(level)
                    lg.propagate, lg.disabled, lg.handlers[:] = propagate, disabled, handlers
            checks.append("LOGGING accepted by logging.config.dictConfig")
        if "CELERY_BEAT_SCHEDULE" in ns:
            from celery.beat import Scheduler

            scheduler = Scheduler(app=self.app, lazy=True)
            scheduler.update_from_dict(ns["CELERY_BEAT_SCHEDULE"])
            for entry in scheduler.schedule.values():
                scheduler.apply_async(entry, advance=False).get()  # eager: runs here
                checks.append(f"beat entry {entry.name!r} sent and ran ({entry.task})")

    def probe_signal_receivers(self, ns: dict[str, Any]) -> str:
        """One real run of a catalogue task, so the sample's signal receivers are called."""
        from catalogue.tasks import recompute_category_stats

        loggers = {v.name for v in ns.values() if isinstance(v, logging.Logger)}
        first = len(self.records.records)
        recompute_category_stats.trigger(42)
        assert run_pending() >= 1
        logged = [r.text for r in self.records.records[first:] if r.name in loggers]
        if loggers:
            assert logged, f"the sample's logger(s) {sorted(loggers)} logged nothing on a run"
            return f"signal receiver called on a run, logged {logged[-1]!r}"
        return "signal receiver called on a run"

    def probe_receiver(self, task: Any) -> str:
        """Save a row of the receiver's model; its flight must run and succeed."""
        from django.db.models.signals import post_save

        from django_debounce.models import DebounceRun

        model = task.debounce_sender
        assert post_save in task.debounce_signals and model is not None, "only post_save probed"
        row = model._default_manager.order_by("pk").first()
        assert row is not None, f"no {model.__name__} row to save"
        row.save()
        run_pending()
        runs = DebounceRun.objects.filter(task_name=task.name)
        outcomes = sorted({run.outcome for run in runs})
        assert outcomes == ["success"], f"{task.name} runs after a save: {outcomes}"
        return f"saving {model.__name__} {row.pk} ran {task.name}: success"


def execute(tree: ast.Module, ns: dict[str, Any], filename: str) -> list[tuple[ast.expr, Any]]:
    """Run the module statement by statement; returns the value of each top-level expression
    and of each call assigned to one name (``status = task.status(...)``)."""
    future, flags = importlib.import_module("__future__"), 0
    for stmt in tree.body:  # a `from __future__ import ...` applies to every statement
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            for alias in stmt.names:
                flags |= getattr(future, alias.name).compiler_flag
    values = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr):
            code = compile(ast.Expression(stmt.value), filename, "eval", flags, dont_inherit=True)
            values.append((stmt.value, eval(code, ns)))  # noqa: S307 - the manual's own code
        else:
            module = ast.Module([stmt], type_ignores=[])
            exec(compile(module, filename, "exec", flags, dont_inherit=True), ns)  # noqa: S102
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
            if isinstance(target, ast.Name) and isinstance(stmt.value, ast.Call):
                values.append((stmt.value, ns[target.id]))
    return values


def settings_name(stmt: ast.stmt) -> str | None:
    target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
    if isinstance(target, ast.Name) and target.id.isupper():
        return target.id
    return None


def known_setting(name: str) -> bool:
    from celery.app.defaults import NAMESPACES, flatten
    from django.conf import global_settings

    from django_debounce.conf import DEFAULTS

    if name.startswith("DEBOUNCE_"):
        return name.removeprefix("DEBOUNCE_") in DEFAULTS
    if name.startswith("CELERY_"):
        celery = {key for key, _option in flatten(NAMESPACES)}
        return name.removeprefix("CELERY_").lower() in celery or name in CELERY_FIXUP_SETTINGS
    return hasattr(global_settings, name)


def decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def check_value(call: ast.expr, value: Any) -> list[str]:
    """What a top-level call returned, for the calls whose result says they did their work
    (the methods of a debounced task, and ``trigger_many``)."""
    from django_debounce import KeyStatus, TriggerResult

    if not isinstance(call, ast.Call):
        return []
    name = decorator_name(call)
    text = ast.unparse(call)
    if len(text) > 60:
        text = text[:57] + "..."
    if name == "trigger":
        assert isinstance(value, TriggerResult), f"{text} returned {value!r}"
        assert not value.deferred and value.flight_id is not None, f"{text}: {value!r}"
        return [f"{text} -> TriggerResult(pending={value.pending})"]
    if name == "trigger_many":
        assert value and all(isinstance(v, TriggerResult) for v in value), f"{text}: {value!r}"
        assert not any(v.deferred for v in value), f"{text}: deferred"
        return [f"{text} -> {len(value)} TriggerResult(s)"]
    if name == "status":
        assert isinstance(value, KeyStatus), f"{text} returned {value!r}, not a KeyStatus"
        return [f"{text} -> KeyStatus(pending={value.pending}, runs={value.runs})"]
    if name == "flush" and isinstance(value, bool):  # a task's (a store's returns a Dispatch)
        assert value is True, f"{text} returned {value!r}, not True (a pending flight ran)"
        return [f"{text} -> True"]
    if name == "cancel":
        assert isinstance(value, int), f"{text} returned {value!r}"
        return [f"{text} -> {value}"]
    if name in ("delay", "apply_async"):
        assert value.successful(), f"{text}: {value.state}"
        return [f"{text} ran ({value.state})"]
    if name == "send_task":
        return [f"{text} published"]
    return []


def check_admin_site(name: str, site: Any) -> str:
    """An ``AdminSite`` a sample builds serves the debounce pages: both models, and the
    summary page among the keys' URLs."""
    from django_debounce.models import DebounceKey, DebounceRun

    for model in (DebounceKey, DebounceRun):
        assert site.is_registered(model), f"{name} does not register {model.__name__}"
    urls = {getattr(p, "name", None) for p in site._registry[DebounceKey].get_urls()}
    assert "django_debounce_debouncekey_summary" in urls, f"{name} has no summary page"
    return f"{name}: an AdminSite serving the debounce keys, runs and summary"


def call_view(view: Any, extra: int) -> str:
    from django.test import RequestFactory

    request = RequestFactory().get("/")
    response = asyncio.run(view(request, *[42] * extra))
    assert response.status_code == 200, f"{view.__name__}: {response.status_code}"
    return f"async view {view.__name__}(request{', 42' * extra}) -> 200 {response.content!r}"


def call_test(test: Any, fixtures: list[str]) -> str:
    """Call a pytest test with the fixtures it names (``db``: inside a transaction that is
    rolled back, as pytest-django's)."""
    import pytest
    from django.db import transaction

    unknown = set(fixtures) - {"settings", "monkeypatch", "db"}
    assert not unknown, f"{test.__name__} needs fixtures the runner has not: {unknown}"
    settings, monkeypatch = SettingsFixture(), pytest.MonkeyPatch()
    given = {"settings": settings, "monkeypatch": monkeypatch, "db": None}
    try:
        with transaction.atomic():
            test(**{name: given[name] for name in fixtures})
            transaction.set_rollback(True)
    finally:
        monkeypatch.undo()
        settings.finalize()
    return f"{test.__name__}({', '.join(fixtures)}) passed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--tmp", type=Path, help="directory for the database (default: new)")
    options = parser.parse_args()
    tmp = options.tmp or Path(tempfile.mkdtemp(prefix="docs-samples-"))

    samples = find_samples()
    app = set_up(tmp)
    records = Records()
    logging.getLogger().addHandler(records)
    logging.getLogger().setLevel(logging.INFO)
    runner = Runner(app, records)
    results = [runner.run(sample) for sample in samples]

    if options.json:
        options.json.write_text(json.dumps({"samples": results}, indent=2, default=repr))
    for result in results:
        state = "skip" if result.get("skipped") else "ok" if result["ok"] else "FAIL"
        print(f"{state:4} {result['id']}", file=sys.stderr)
        for check in result["checks"]:
            print(f"       {check}", file=sys.stderr)
        if not result["ok"]:
            print(result["error"], file=sys.stderr)
    failed = [r["id"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)} of {len(results)} samples ran", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
