"""I8: a trigger whose dispatch message cannot be published raises to the caller and leaves
the key as if it had not been made; the next trigger publishes afresh. The broker failure is
real: the Celery app is pointed at a loopback port where nothing listens."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kombu import pools

from django_debounce.exceptions import PublishError
from django_debounce.keys import key_hash
from tests.celery_app import app
from tests.conftest import stays, wait_for
from tests.servers import free_port
from tests.testapp.models import RunLog
from tests.testapp.tasks import record

pytestmark = pytest.mark.worker


def _reset_pools() -> None:
    app.pool.force_close_all()
    app._pool = None
    app.amqp._producer_pool = None
    pools.reset()


@contextmanager
def broker_down() -> Iterator[None]:
    original = app.conf.broker_url
    app.conf.broker_url = f"redis://127.0.0.1:{free_port()}/0"
    _reset_pools()
    try:
        yield
    finally:
        app.conf.broker_url = original
        _reset_pools()


def test_unpublishable_trigger_raises_and_is_not_counted(worker, unique_tag):
    hashed = key_hash(record.name, record.resolve((unique_tag,), {})[0])
    with broker_down(), pytest.raises(PublishError, match="trigger again"):
        record.trigger(unique_tag)
    live = record.get_backend().live_state(hashed)
    assert live is None or (live["pending"], live["triggers"], live["flight_id"]) == (0, 0, 0)
    result = record.trigger(unique_tag)  # the broker is back: this one publishes afresh
    assert result.scheduled and result.pending == 1
    runs = wait_for(lambda: list(RunLog.objects.filter(tag=unique_tag, finished__isnull=False)))
    assert stays(lambda: RunLog.objects.filter(tag=unique_tag).count() == 1, duration=1.0)
    assert runs[0].triggers == 1


def test_trigger_deferred_to_a_commit_is_kept_when_its_message_cannot_be_published(
    worker, unique_tag, caplog
):
    """After the commit the caller cannot trigger again: the trigger stays counted, and
    recovery publishes its message once it is overdue (late, never lost)."""
    from django.db import transaction
    from django.test import override_settings

    from django_debounce.recovery import recover

    hashed = key_hash(record.name, record.resolve((unique_tag,), {})[0])
    with broker_down():
        with transaction.atomic():
            result = record.trigger(unique_tag)
        assert result.deferred  # the commit ran the trigger, and did not raise
    assert "could not be published" in caplog.text
    assert record.get_backend().live_state(hashed)["pending"] == 1
    with override_settings(DEBOUNCE_DISPATCH_GRACE=0.5):
        wait_for(lambda: recover() >= 1, timeout=20, message="recovery to re-publish")
    runs = wait_for(lambda: list(RunLog.objects.filter(tag=unique_tag, finished__isnull=False)))
    assert runs[0].triggers == 1
