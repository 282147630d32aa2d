"""The debounced tasks of ``manage.py demo --modes``: one per mode of the mode
table (docs/guide/modes.md).

A plain ``post_save`` receiver on ``ModeDoc`` triggers the task of the row's mode with the
row's primary key; the job re-reads the row, sleeps its ``job_ms`` and records a ``DemoRun``
(``finished`` is 0 while the body runs, so runs that overlap can be seen).
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.db.models.signals import post_save
from django.dispatch import receiver

from django_debounce import RunInfo, debounced_task
from example_project.demo.models import DemoRun, ModeDoc

WAIT = 0.3  # the quiet period W of every mode
MAX_WAIT = 1.0  # M of the bounded mode
COLLECT_LIMIT = 5


def _job(mode: str, pks: list[Any], debounce: RunInfo, items: list[Any] | None = None) -> None:
    rows = list(ModeDoc.objects.filter(pk__in=pks))
    run = DemoRun.objects.create(
        scenario=f"mode:{mode}",
        doc_pk=pks[0] if pks else None,
        version_seen=max((r.version for r in rows), default=None),
        triggers=debounce.triggers,
        started=time.time(),
        finished=0.0,
        pid=os.getpid(),
        items=items,
    )
    time.sleep(max((r.job_ms for r in rows), default=30) / 1000)
    run.finished = time.time()
    run.save(update_fields=["finished"])


def _task(mode: str, **options: Any) -> Any:
    def body(pk: int, *, debounce: RunInfo) -> None:
        _job(mode, [pk], debounce)

    body.__name__ = body.__qualname__ = f"mode_{mode}"
    return debounced_task(name=f"demo.mode.{mode}", **options)(body)


def _collect_task(mode: str, **options: Any) -> Any:
    def body(pks: list[int], *, debounce: RunInfo) -> None:
        _job(mode, pks, debounce, items=pks)

    body.__name__ = body.__qualname__ = f"mode_{mode}"
    return debounced_task(name=f"demo.mode.{mode}", collect=True, **options)(body)


MODES: dict[str, Any] = {
    "debounce": _task("debounce", wait=WAIT),
    "bounded": _task("bounded", wait=WAIT, max_wait=MAX_WAIT),
    "leading": _task("leading", wait=WAIT, leading=True),
    "leading_only": _task("leading_only", wait=WAIT, leading=True, trailing=False),
    "throttle": _task("throttle", wait=WAIT, max_wait=WAIT, leading=True),
    "coalesce": _task("coalesce", wait=0),
    "collect": _collect_task("collect", wait=WAIT, collect_limit=COLLECT_LIMIT),
    "overlap": _task("overlap", wait=WAIT, overlap=True),
}


@receiver(post_save, sender=ModeDoc, dispatch_uid="demo.modes")
def mode_doc_saved(sender: Any, instance: ModeDoc, **kwargs: Any) -> None:
    MODES[instance.mode].trigger(instance.pk)
