"""Crash safety (I7) with real worker processes killed by SIGKILL."""

from __future__ import annotations

import time

import pytest

from django_debounce.models import DebounceRun
from tests.conftest import Worker, wait_for
from tests.testapp.models import RunLog
from tests.testapp.tasks import crashy

pytestmark = pytest.mark.worker


def test_run_killed_mid_body_is_redone_after_its_lease(
    celery_worker_session, store, transactional_db, unique_tag
):
    worker = Worker(concurrency=1, queue="debounce-crash")
    worker.start()
    try:
        crashy.trigger(unique_tag, 30.0)  # the first run would take 30 s
        first = wait_for(lambda: RunLog.objects.filter(tag=unique_tag).first(), message="first run")
        worker.kill()
        killed_at = time.time()
        worker = Worker(concurrency=1, queue="debounce-crash")
        worker.start()
        for at in (1.0, 2.0):
            time.sleep(max(0.0, killed_at + at - time.time()))
            crashy.trigger(unique_tag, 0.0)
        # lease 3 s from the first run's start, plus dispatch latency
        redo = wait_for(
            lambda: RunLog.objects.filter(tag=unique_tag, finished__isnull=False).first(),
            timeout=3 + 10,
            message="the redo",
        )
        assert redo.pk != first.pk
        assert redo.started <= first.started + 3 + 6
        assert redo.triggers == 3  # the lost run's trigger came back, with the two new ones
        assert DebounceRun.objects.filter(outcome="lost").count() == 1
        assert RunLog.objects.filter(tag=unique_tag).count() == 2
    finally:
        worker.stop()
