"""Recovery is the pump (docs/design.md, "Dispatch at scale"): lost runs are found from their
lease entries (I7), lost messages from their taken entries, re-published after
``DEBOUNCE_DISPATCH_GRACE`` with the same sequence (a duplicate, never a second run: I5).
Real worker processes, killed with SIGKILL; a real broker whose messages are deleted."""

from __future__ import annotations

import base64
import json
import time

import pytest
from django.test import override_settings

from django_debounce.keys import key_hash
from django_debounce.models import DebounceRun
from django_debounce.pump import Pump
from tests.support.helpers import stays, wait_for
from tests.support.workers import Worker
from tests.testapp.models import RunLog
from tests.testapp.tasks import crashy, orphan

pytestmark = pytest.mark.worker


def messages(broker, queue: str) -> list[dict]:
    """The ``__debounce__`` values of the messages waiting in ``queue`` (kombu's Redis
    transport keeps them as JSON envelopes with a base64 body ``[args, kwargs, embed]``)."""
    out = []
    for raw in broker.lrange(queue, 0, -1):
        envelope = json.loads(raw)
        _args, kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
        out.append(kwargs["__debounce__"])
    return out


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
        ready = time.time()  # a loaded machine starts a worker slowly: no redo before this
        for at in (1.0, 2.0):
            time.sleep(max(0.0, killed_at + at - time.time()))
            crashy.trigger(unique_tag, 0.0)
        # lease 3 s from the first run's claim; the pump finds the lease entry at its end
        redo = wait_for(
            lambda: RunLog.objects.filter(tag=unique_tag, finished__isnull=False).first(),
            timeout=3 + 10,
            message="the redo",
        )
        assert redo.pk != first.pk
        assert redo.started >= first.started + 3  # not before the lease ran out (I2)
        assert redo.started <= max(first.started + 3, ready) + 6
        assert redo.triggers == 3  # the lost run's trigger came back, with the two new ones
        # the lost run is recorded as lost
        wait_for(
            lambda: (
                DebounceRun.objects.filter(outcome="lost").count() == 1
                and DebounceRun.objects.filter(outcome="success").count() == 1
            ),
            timeout=15,
            message="the lost and the redone run in the durable record",
        )
        lost = DebounceRun.objects.get(outcome="lost")
        assert (lost.run_id, lost.triggers, lost.error) == (1, 1, "lease ran out")
        assert DebounceRun.objects.get(outcome="success").attempt == 1  # a lost run counts
        assert stays(lambda: RunLog.objects.filter(tag=unique_tag).count() == 2, duration=1.0)
    finally:
        worker.stop()


def test_a_lost_message_is_published_again_after_the_grace_with_its_sequence(
    celery_worker_session, store, transactional_db, broker, unique_tag
):
    """A message the broker lost (deleted here; a broker restarted empty, a worker killed
    with it prefetched) is taken again by a pump once ``DEBOUNCE_DISPATCH_GRACE`` has passed,
    with the same sequence, and runs once."""
    queue = "debounce-recovery"  # no worker consumes it until the end of the test
    broker.delete(queue)
    h = key_hash(orphan.name, orphan.resolve((unique_tag,), {})[0])
    with override_settings(DEBOUNCE_DISPATCH_GRACE=2):
        result = orphan.trigger(unique_tag)  # wait 0.1 s: published at once, with a countdown
        published = time.monotonic()
        assert result.scheduled
        first = messages(broker, queue)
        assert [(m["k"], m["v"]) for m in first] == [(h, 2)]
        seq = first[0]["s"]
        broker.delete(queue)  # lost
        pump = Pump()
        # before the grace: nothing is taken again (whichever pump looks)
        pump.tick()
        assert time.monotonic() - published < 2 and messages(broker, queue) == []
        # after it: a pump publishes the flight again, with the same sequence
        again = wait_for(
            lambda: (pump.tick(), messages(broker, queue))[1],
            timeout=10,
            interval=0.2,
            message="the flight published again",
        )
        assert time.monotonic() - published >= 2
    assert [(m["k"], m["s"]) for m in again] == [(h, seq)]
    worker = Worker(concurrency=1, queue=queue)
    worker.start()
    try:
        run = wait_for(
            lambda: RunLog.objects.filter(tag=unique_tag, finished__isnull=False).first(),
            message="the run",
        )
        assert run.triggers == 1
        # the second copy (if any pump also re-sent it) is a duplicate: never a second run
        assert stays(lambda: RunLog.objects.filter(tag=unique_tag).count() == 1, duration=1.5)
    finally:
        worker.stop()
