"""Celery task options on the decorator (issue 13.1, 13.4): routing options send dispatch
messages and retries where the task is routed, with a readable key for Flower and
``celery events``; ``bind=True`` gives the body ``self``; ``expires`` is set on messages.
The tasks are registered in the test process only, on a queue no worker consumes: the test
reads the messages from the broker, as Flower would."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
import redis
from django.conf import settings

from django_debounce import RunInfo, debounced_task
from django_debounce.testing import run_due

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "debounce-routed"
SEEN: list[dict[str, Any]] = []


@debounced_task(
    wait=30,
    name="tests.routed",
    queue=QUEUE,
    routing_key=QUEUE,
    exchange=QUEUE,
    expires=3600,
    max_retries=2,
    default_retry_delay=0,
    bind=True,
)
def routed(self, product_id: int, fail: bool = False, *, debounce: RunInfo) -> None:
    SEEN.append(
        {
            "task": self.name,
            "retries": self.request.retries,
            "attempt": debounce.attempt,
            "product_id": product_id,
        }
    )
    if fail:
        raise RuntimeError("fails")


@pytest.fixture
def broker():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(QUEUE)
    SEEN.clear()
    yield client
    client.delete(QUEUE)


def messages(broker) -> list[dict[str, Any]]:
    """The messages waiting in the queue (the Redis transport: a list of JSON envelopes)."""
    out = []
    for raw in reversed(broker.lrange(QUEUE, 0, -1)):
        envelope = json.loads(raw)
        args, kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
        out.append({"headers": envelope["headers"], "kwargs": kwargs})
    return out


def test_dispatch_messages_go_to_the_routed_queue_with_a_readable_key(broker, store):
    result = routed.trigger(42, debounce_wait=0)  # due at once: published by the trigger
    (message,) = messages(broker)
    headers = message["headers"]
    assert headers["task"] == "tests.routed"
    assert re.fullmatch(
        rf"\{{'key': {re.escape(repr(result.key))}, 'seq': \d+\}}", headers["kwargsrepr"]
    )
    assert headers["argsrepr"] == "()"
    assert headers["expires"] is not None  # expires=3600 reaches the message
    assert set(message["kwargs"]) == {"__debounce__"}


def test_a_long_key_is_truncated_for_monitoring(broker, store):
    routed.trigger(10**170, debounce_wait=0)
    (message,) = messages(broker)
    shown = shown_key(message)
    assert shown.endswith("…") and len(shown) == 128


@debounced_task(wait=30, name="tests.labelled", queue=QUEUE, routing_key=QUEUE, exchange=QUEUE)
def labelled(ref: str) -> None:
    """Its key is its argument (``catalogue.product:<uuid>`` and longer)."""


labelled.debounce_key = lambda ref: ref

UUID_KEY = "catalogue.product:4433b791-84a7-4c03-8300-6a3c8c2d1f5e"
KEY_120 = "catalogue.product:" + "-".join([UUID_KEY[18:]] * 3)[:102]


def shown_key(message: dict[str, Any]) -> str:
    """The key that Flower and ``celery events`` show: the published ``kwargsrepr``."""
    match = re.fullmatch(r"\{'key': '(.*)', 'seq': \d+\}", message["headers"]["kwargsrepr"])
    assert match, message["headers"]["kwargsrepr"]
    assert message["headers"]["argsrepr"] == "()"
    return match.group(1)


def pumped(task, broker) -> list[dict[str, Any]]:
    """The messages the pump publishes for ``task``'s due flights (taken with the clock past
    their due time: the workers' pumps do not know the task)."""
    from datetime import timedelta

    from django.utils import timezone

    from django_debounce.pump import Pump, queue_of
    from tests.celery_app import app

    broker.delete(QUEUE)
    backend = task.get_backend()
    future = timezone.now() + timedelta(seconds=task.wait + 1)
    taken = backend.take({task.name: task.flight_options()}, 100, now=future)
    Pump(app=app)._publish(backend, queue_of(task), {task.name: task}, taken.dispatches)
    return messages(broker)


@pytest.mark.parametrize(
    "key", [UUID_KEY, KEY_120, "x" * 128], ids=["uuid", "120-characters", "128-characters"]
)
def test_flower_shows_the_whole_key_on_the_direct_and_the_pumps_path(broker, store, key):
    """Issue 5: Flower showed ``catalogue.product:4433b791-84a7-4c03-83...`` (the Redis store's
    40 characters) for a flight the pump published. A key of up to 128 characters is shown
    whole by both publishes: a trigger's (due at once) and the pump's (from the due index)."""
    assert len(KEY_120) == 120
    labelled.trigger(key, debounce_wait=0)
    (direct,) = messages(broker)
    assert shown_key(direct) == key
    assert labelled.cancel(key) == 1
    labelled.trigger(key)  # due in 30 s: waits in the due index for a pump
    (pumped_message,) = pumped(labelled, broker)
    assert shown_key(pumped_message) == key


def test_the_pump_shows_a_longer_key_cut_and_a_default_key_as_the_trigger_does(broker, store):
    long_key = "catalogue.product:" + "0123456789" * 30
    labelled.trigger(long_key)
    (message,) = pumped(labelled, broker)
    assert shown_key(message) == long_key[:127] + "…"
    routed.trigger(10**60)  # the default key: the task name and its arguments
    (message,) = pumped(routed, broker)
    assert shown_key(message) == routed.resolve((10**60,), {})[0]
    assert len(shown_key(message)) > 80


def test_bind_gives_the_body_self_and_its_request(broker, store):
    routed.trigger(7, debounce_wait=0)
    assert run_due() == 1
    assert SEEN == [{"task": "tests.routed", "retries": 0, "attempt": 0, "product_id": 7}]


def test_a_retry_goes_to_the_routed_queue(broker, store):
    """The worker's path: the message is executed (``apply``, as a worker would), the body
    raises, and the retry's dispatch message goes to the task's queue."""
    routed.trigger(8, True, debounce_wait=0)
    (first,) = messages(broker)
    broker.delete(QUEUE)  # the worker took it
    routed.apply(kwargs=first["kwargs"])
    assert SEEN[-1]["retries"] == 0
    (retry,) = messages(broker)  # default_retry_delay=0: due at once, published at once
    assert retry["headers"]["task"] == "tests.routed"
    assert retry["kwargs"]["__debounce__"]["k"] == first["kwargs"]["__debounce__"]["k"]
    broker.delete(QUEUE)
    routed.apply(kwargs=retry["kwargs"])
    assert [seen["retries"] for seen in SEEN] == [0, 1]


def test_the_pump_and_plain_calls_see_the_decorators_queue(broker):
    """The pump caps a task by the queue it is routed to; ``delay()`` stays a plain Celery
    call that goes there too; no Celery deprecation warning for the routing options."""
    from django_debounce.pump import queue_of

    assert queue_of(routed) == QUEUE
    routed.delay(1)
    (message,) = messages(broker)
    assert message["kwargs"] == {} and message["headers"]["task"] == "tests.routed"


def test_routing_options_are_not_task_attributes():
    """Celery 5.5+ deprecates ``queue``/``routing_key``/... as task class attributes (a
    warning when the class binds; no effect from Celery 6): the decorator keeps them in
    ``debounce_route``, which every publish gets."""
    cls = type(routed._get_current_object())
    for name in ("queue", "routing_key", "exchange"):
        assert name not in cls.__dict__
    assert cls.debounce_route == {"queue": QUEUE, "routing_key": QUEUE, "exchange": QUEUE}
