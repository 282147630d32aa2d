"""Bad input (issue 12.7): every bad value is a ``TypeError``/``ValueError`` (or, for a
declaration, ``ImproperlyConfigured``; for a command, ``CommandError``) naming the fix, raised
before anything is stored, on every store; a malformed dispatch message is logged and dropped."""

from __future__ import annotations

import logging

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import transaction

from django_debounce import debounced_task, trigger_many
from django_debounce.exceptions import IntegerTooLong
from django_debounce.models import DebounceKey
from tests.support.call_options import bad_calls
from tests.testapp.models import Item
from tests.testapp.tasks import item_saved, record

# No worker runs during this module: its tests trigger keys whose flights come due in real
# time (``record``: 0.3 s), and a session worker running one while the tables are flushed
# after the test deadlocked with the flush once (the next test then found the key's run).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_workers")]


def deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


BAD_ARGUMENTS = [
    pytest.param(("a\x00b",), ValueError, "NUL character", id="nul"),
    pytest.param(("ok", 0.0, "x\x00"), ValueError, "NUL character", id="nul-in-a-later-argument"),
    pytest.param(("\ud800",), ValueError, "not valid UTF-8", id="lone-surrogate"),
    pytest.param((deep(10_000),), ValueError, "nested too deeply", id="10000-deep"),
    pytest.param((object(),), TypeError, "cannot encode", id="not-json"),
    pytest.param((float("nan"),), TypeError, "cannot encode", id="nan"),
    pytest.param(("x" * 70_000,), ValueError, "DEBOUNCE_MAX_PAYLOAD", id="too-large"),
    pytest.param((10**5000,), IntegerTooLong, "integer of more than 4,300 digits", id="int-5001"),
    pytest.param(
        ("ok", 0.0, {"n": [-(10**4300)]}), IntegerTooLong, "set_int_max_str_digits", id="int-deep"
    ),
]


def nothing_stored(task, *args) -> bool:
    return not DebounceKey.objects.filter(task_name=task.name).exists() and (
        not args or task.status(*args) is None
    )


@pytest.mark.parametrize("args, error, text", BAD_ARGUMENTS)
def test_a_bad_argument_is_refused_before_anything_is_stored(store, args, error, text):
    with pytest.raises(error, match=text):
        record.trigger(*args)
    assert nothing_stored(record)
    with pytest.raises(error, match=text):
        trigger_many(record, [("fine",), args])
    assert nothing_stored(record), "trigger_many checks every item before counting one"


def test_a_too_long_integer_names_the_limit_and_the_fix_inside_a_transaction(store):
    """Python's own text ("Exceeds the limit (4300 digits) for integer string conversion")
    names neither the argument nor a fix; the error is raised by ``trigger()`` itself, in
    the transaction, not deferred to its commit (where the caller could no longer act)."""
    with transaction.atomic():
        with pytest.raises(IntegerTooLong) as err:
            record.trigger(10**5000)
        assert isinstance(err.value, ValueError)
        assert "Exceeds the limit" not in str(err.value)
        assert "about 5,001" in str(err.value) and "as a string" in str(err.value)
    assert nothing_stored(record)
    assert record.trigger(10**4299).flight_id is not None  # within the limit: stored


def test_the_payload_limit_is_a_setting(store, settings):
    settings.DEBOUNCE_MAX_PAYLOAD = 1_000_000
    assert record.trigger("x" * 70_000).flight_id is not None
    settings.DEBOUNCE_MAX_PAYLOAD = 100
    with pytest.raises(ValueError, match=r"more than DEBOUNCE_MAX_PAYLOAD \(100\)"):
        record.trigger("x" * 200)


def _nul_key_body(tag):
    return None


nul_key = debounced_task(wait=1, name="tests.bad_key", key=lambda tag: f"k\x00{tag}")(_nul_key_body)


def test_a_bad_key_text_is_refused(store):
    with pytest.raises(ValueError, match="key with a NUL character"):
        nul_key.trigger("a")
    assert nothing_stored(nul_key)


def test_a_bad_primary_key_of_a_receiver_is_refused(store):
    with pytest.raises(TypeError, match="not a primary key of testapp.Item"):
        item_saved.trigger(Item, "not-a-number")
    with pytest.raises(TypeError, match="needs a saved row"):
        item_saved.trigger(Item())
    assert nothing_stored(item_saved)


@pytest.mark.parametrize(
    "options, text",
    # every per-call option with every bad value of its kind (tests/support/call_options.py)
    [
        pytest.param(keywords, text, id=",".join(f"{k}={v!r}" for k, v in keywords.items()))
        for keywords, text in bad_calls()
    ],
)
def test_bad_per_trigger_options_are_refused(store, options, text):
    with pytest.raises((TypeError, ValueError), match=text):
        record.trigger("t", **options)
    assert nothing_stored(record)


@pytest.mark.parametrize(
    "options, text",
    [
        ({"wait": 1e12}, "at most a year"),
        ({"wait": -1}, ">= 0"),
        ({"max_wait": float("nan")}, "finite"),
        ({"lease": 0}, "lease must be a finite number > 0 seconds"),
        ({"lease": -3}, "lease must be a finite number > 0 seconds"),
        ({"collect_limit": 0, "collect": True}, "positive int"),
        ({"expires": 5}, "DEBOUNCE_DISPATCH_GRACE"),
        ({"wiat": 5}, "Did you mean 'wait'"),
    ],
)
def test_bad_declarations_are_refused_naming_the_fix(options, text):
    with pytest.raises((ImproperlyConfigured, TypeError), match=text):
        debounced_task(name="tests.bad_declaration", **options)(body)


def body(tag):
    return None


@pytest.mark.parametrize(
    "args, text",
    [
        (["--older-than", "99999999999d"], "older-than"),
        (["--older-than", "7"], "unit"),
        (["--older-than", "7d", "--batch-size", "99999999999999999999"], "batch-size"),
        (["--older-than", "7d", "--batch-size", "0"], "batch-size"),
    ],
)
def test_bad_purge_arguments_are_command_errors(args, text):
    with pytest.raises(CommandError, match=text):
        call_command("debounce_purge", *args)


@pytest.mark.parametrize(
    "message",
    [
        {"k": "a" * 64, "s": -1, "b": "r", "v": 2},
        {"k": "a" * 64, "s": "1", "b": "r", "v": 2},
        {"k": "a" * 64, "s": True, "b": "r", "v": 2},
        {"k": "a" * 64, "s": 1.5, "b": "d", "v": 2},
        {"k": 7, "s": 1, "b": "r", "v": 2},
        {"k": "a" * 64, "s": 1, "b": "x", "v": 2},
        {"k": "a" * 64, "s": 1, "b": "r", "v": 99},
        {"k": "z" * 64, "s": 1, "b": "r", "v": 2},
        {"k": "A" * 64, "s": 1, "b": "d", "v": 2},
        {"k": "é" * 64, "s": 1, "v": 2},
        {"k": "z" * 64, "w": 1, "b": "r"},
        "not a dict",
    ],
)
def test_a_malformed_dispatch_message_is_logged_and_dropped(store, message, caplog):
    """As the worker runs it (``apply`` with the message's keyword): no run, no exception."""
    record.trigger("real")
    with caplog.at_level(logging.ERROR, logger="django_debounce"):
        result = record.apply(kwargs={"__debounce__": message})
    assert result.successful() and result.result is None
    assert "malformed dispatch message" in caplog.text
    status = record.status("real")
    assert status is not None and status.pending == 1 and status.runs == 0


def test_a_collected_run_takes_at_most_max_batch_payload_bytes(store, settings):
    """A run of a collecting task gets at most ``DEBOUNCE_MAX_BATCH_PAYLOAD`` bytes of items
    (never fewer than one); the rest run next, at once, and none is lost."""
    from datetime import timedelta

    from django_debounce import dbtime
    from django_debounce.keys import dumps
    from django_debounce.testing import run_due
    from tests.celery_app import app
    from tests.testapp.models import RunLog
    from tests.testapp.tasks import batch

    items = [{"tag": "bytes", "n": n} for n in range(4)]  # 20 bytes of JSON each
    settings.DEBOUNCE_MAX_BATCH_PAYLOAD = 2 * len(dumps(items[0]).encode())
    app.conf.task_always_eager = True
    try:
        for item in items:
            batch.trigger(item)
        assert run_due(now=dbtime.now() + timedelta(seconds=1)) == 2
    finally:
        app.conf.task_always_eager = False
    runs = RunLog.objects.filter(task="testapp.batch", tag="bytes").order_by("started")
    assert [run.payload for run in runs] == [[0, 1], [2, 3]]
