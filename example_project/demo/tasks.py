"""The demo's jobs: every body sleeps ``JOB_SECONDS`` (the "slow follow-up work") and records
its run in ``DemoRun``.

Scenario a uses a plain Django receiver and a plain Celery task (what people write first);
b, c and d use ``debounced_receiver`` with different options.
"""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any

from celery import shared_task
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from django_debounce import RunInfo, debounced_receiver
from example_project.demo.models import CoalesceDoc, DebounceDoc, DemoRun, PerSaveDoc, StreamDoc

JOB_SECONDS = 0.03

DEBOUNCE_WAIT = 0.05
STREAM_WAIT = 0.05
STREAM_MAX_WAIT = 0.5


def _job(scenario: str, pk: Any, version: int | None, debounce: RunInfo | None) -> None:
    started = time.time()
    time.sleep(JOB_SECONDS)
    DemoRun.objects.create(
        scenario=scenario,
        doc_pk=pk,
        version_seen=version,
        triggers=debounce.triggers if debounce is not None else None,
        started=started,
        finished=time.time(),
        pid=os.getpid(),
    )


# -- a. one task per save ---------------------------------------------------------------------


@shared_task(name="demo.per_save_job", ignore_result=True)
def per_save_job(pk: int) -> None:
    started = time.time()
    doc = PerSaveDoc.objects.filter(pk=pk).first()
    if doc is None:  # a message left by an earlier demo run: its row is gone
        return
    time.sleep(JOB_SECONDS)
    DemoRun.objects.create(
        scenario="per_save",
        doc_pk=pk,
        version_seen=doc.version,
        started=started,
        finished=time.time(),
        pid=os.getpid(),
    )


@receiver(post_save, sender=PerSaveDoc, dispatch_uid="demo.per_save")
def per_save(sender: Any, instance: PerSaveDoc, using: str, **kwargs: Any) -> None:
    transaction.on_commit(partial(per_save_job.delay, instance.pk), using=using)


# -- b, c, d. debounced receivers -------------------------------------------------------------


@debounced_receiver(post_save, sender=DebounceDoc, wait=DEBOUNCE_WAIT, name="demo.debounce")
def debounce_job(
    sender: Any, instance: DebounceDoc | None, pk: Any, debounce: RunInfo, **kwargs: Any
) -> None:
    _job("debounce", pk, instance.version if instance else None, debounce)


@debounced_receiver(post_save, sender=CoalesceDoc, wait=0, name="demo.coalesce")
def coalesce_job(
    sender: Any, instance: CoalesceDoc | None, pk: Any, debounce: RunInfo, **kwargs: Any
) -> None:
    _job("coalesce", pk, instance.version if instance else None, debounce)


@debounced_receiver(
    post_save, sender=StreamDoc, wait=STREAM_WAIT, max_wait=STREAM_MAX_WAIT, name="demo.stream"
)
def stream_job(
    sender: Any, instance: StreamDoc | None, pk: Any, debounce: RunInfo, **kwargs: Any
) -> None:
    _job("stream", pk, instance.version if instance else None, debounce)


from example_project.demo import modes  # noqa: E402, F401  (the tasks of `demo --modes`)
