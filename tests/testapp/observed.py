"""Tasks and signal receivers for the signal, logging and metrics tests.

The receivers record every django-debounce signal of the ``testapp.observed*`` tasks as a
``RunLog`` row (``task="signal:<name>"``, the keyword arguments in ``payload``), in whichever
process sends it: the worker for ``run_started``/``run_finished``, the triggering process for
``trigger_received``. The receiver for ``testapp.observed_raising`` raises, to show that a
broken receiver never breaks a trigger or a run's bookkeeping.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from typing import Any

from django.dispatch import receiver

from django_debounce import RunInfo, debounced_task
from django_debounce.signals import run_finished, run_started, trigger_received
from tests.testapp.models import RunLog


@debounced_task(wait=0.2, name="testapp.observed")
def observed(tag: str, *, debounce: RunInfo) -> None:
    RunLog.objects.create(
        task="testapp.observed",
        tag=tag,
        key=debounce.key,
        triggers=debounce.triggers,
        flight_id=debounce.flight_id,
        run_id=debounce.run_id,
        pid=os.getpid(),
        started=time.time(),
    )


@debounced_task(wait=0.2, name="testapp.observed_fail", max_retries=0)
def observed_fail(tag: str) -> None:
    raise ValueError(f"boom {tag}")


@debounced_task(wait=0.2, name="testapp.observed_retry", max_retries=1, default_retry_delay=0)
def observed_retry(tag: str) -> None:
    raise ValueError(f"again {tag}")


@debounced_task(wait=0.2, name="testapp.observed_raising")
def observed_raising(tag: str, *, debounce: RunInfo) -> None:
    RunLog.objects.create(
        task="testapp.observed_raising",
        tag=tag,
        triggers=debounce.triggers,
        pid=os.getpid(),
        started=time.time(),
    )


def _json(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _record(name: str, sender: Any, kwargs: dict[str, Any]) -> None:
    if not getattr(sender, "name", "").startswith("testapp.observed"):
        return
    if sender.name == "testapp.observed_raising":
        raise RuntimeError(f"a broken receiver of {name}")
    RunLog.objects.create(
        task=f"signal:{name}",
        tag=sender.name,
        key=kwargs.get("key", ""),
        triggers=kwargs.get("triggers", kwargs.get("pending")),
        flight_id=kwargs.get("flight_id"),
        run_id=kwargs.get("run_id"),
        payload={k: _json(v) for k, v in kwargs.items() if k != "signal"},
        pid=os.getpid(),
        started=time.time(),
    )


@receiver(trigger_received, dispatch_uid="testapp.observed.trigger_received")
def on_trigger(sender: Any, **kwargs: Any) -> None:
    _record("trigger_received", sender, kwargs)


@receiver(run_started, dispatch_uid="testapp.observed.run_started")
def on_run_started(sender: Any, **kwargs: Any) -> None:
    _record("run_started", sender, kwargs)


@receiver(run_finished, dispatch_uid="testapp.observed.run_finished")
def on_run_finished(sender: Any, **kwargs: Any) -> None:
    if getattr(sender, "name", "") == "testapp.observed":
        # what the records say when the run's finish is reported (the store's finish came
        # just before, in the same process): the run's outcome and its key's state
        from django_debounce.models import DebounceKey, DebounceRun

        run = DebounceRun.objects.filter(
            task_name=sender.name, run_id=kwargs.get("run_id"), debounce_key__key=kwargs["key"]
        ).first()
        key = DebounceKey.objects.filter(task_name=sender.name, key=kwargs["key"]).first()
        RunLog.objects.create(
            task="records-at-finish",
            tag=sender.name,
            key=kwargs["key"],
            payload={"run": run.outcome if run else None, "key": key.state if key else None},
            pid=os.getpid(),
            started=time.time(),
        )
    _record("run_finished", sender, kwargs)
