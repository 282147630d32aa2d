"""Arguments beyond JSON: the types of Django's ``DjangoJSONEncoder`` reach the body typed,
one value is one key, and anything else is refused at ``trigger()``, inside the caller's
transaction, before anything is counted or deferred."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, transaction

from django_debounce import debounced_task, trigger_many
from django_debounce.exceptions import DebounceError, UnsupportedArgument
from django_debounce.models import DebounceKey
from tests.support.helpers import wait_for
from tests.testapp.models import RunLog
from tests.testapp.tasks import record_args

received: list[tuple] = []


@debounced_task(wait=60, name="testapp.typed_args")
def typed_args(value, when=None, *, debounce=None):
    received.append((value, when))


@debounced_task(wait=60, collect=True, name="testapp.typed_items")
def typed_items(items):
    received.append(tuple(items))


VALUES = [
    uuid.UUID("6FA459EA-EE8A-3CA4-894E-DB77E160355E"),
    Decimal("1.10"),
    datetime(2024, 3, 1, 12, 30, 0, 123456, tzinfo=UTC),
    datetime(2024, 3, 1, 12, 30),  # naive: as given
    date(2024, 2, 29),
    time(23, 59, 59, 999999),
    timedelta(days=-1, seconds=5, microseconds=7),
]


@pytest.fixture(autouse=True)
def _clear_received():
    received.clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_typed_arguments_reach_the_body_as_the_same_typed_values(eager, store, value):
    typed_args.trigger(value, when=[value])
    assert typed_args.flush(value, when=[value]) is True
    assert received == [(value, [value])]
    got = received[0][0]
    assert type(got) is type(value) and repr(got) == repr(value)


@pytest.mark.django_db(transaction=True)
def test_collected_typed_items_reach_the_body_typed(eager, store):
    for value in VALUES:
        typed_items.trigger(value)
    typed_items.trigger(uuid.UUID(str(VALUES[0]).upper()))  # the same item again
    assert typed_items.flush() is True
    assert received == [tuple(VALUES)]


@pytest.mark.django_db(transaction=True)
def test_an_aware_datetime_is_one_key_in_any_zone_and_arrives_in_utc(eager, store):
    paris = datetime(2024, 7, 1, 14, 0, tzinfo=ZoneInfo("Europe/Paris"))
    result = typed_args.trigger(paris)
    assert typed_args.trigger(datetime(2024, 7, 1, 12, 0, tzinfo=UTC)).key == result.key
    assert '"2024-07-01T12:00:00+00:00"' in result.key
    assert typed_args.flush(paris) is True
    (got, _when), *_ = received
    assert got == paris and got.utcoffset() == timedelta(0)
    assert DebounceKey.objects.get().triggers == 2


@pytest.mark.django_db(transaction=True)
def test_uuid_and_decimal_keys_follow_their_canonical_forms(store):
    text = "6fa459ea-ee8a-3ca4-894e-db77e160355e"
    assert (
        typed_args.trigger(uuid.UUID(text.upper())).key
        == typed_args.trigger(uuid.UUID(text)).key
        == typed_args.resolve((uuid.UUID(hex=text.replace("-", "")),), {})[0]
    )
    assert text in typed_args.resolve((uuid.UUID(text),), {})[0]
    # A Decimal is kept as written (its exponent is part of the value a body gets):
    # Decimal("1.10") and Decimal("1.1") are two keys, as 1 and 1.0 are.
    assert (
        typed_args.resolve((Decimal("1.10"),), {})[0]
        != (typed_args.resolve((Decimal("1.1"),), {})[0])
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("value", [object(), {1, 2}, b"bytes", {uuid.uuid4(): 1}])
def test_anything_else_is_refused_in_the_callers_transaction_before_it_is_deferred(store, value):
    with transaction.atomic():
        with pytest.raises(UnsupportedArgument) as info:
            typed_args.trigger(value)
        assert connection.run_on_commit == []  # nothing deferred to the commit
        with pytest.raises(UnsupportedArgument):
            trigger_many(typed_args, [(uuid.uuid4(),), (value,)])
        assert connection.run_on_commit == []
    message = str(info.value)
    assert isinstance(info.value, DebounceError) and isinstance(info.value, TypeError)
    assert type(value if not isinstance(value, dict) else next(iter(value))).__name__ in message
    assert "primary key" in message
    assert not DebounceKey.objects.exists()
    assert typed_args.status(uuid.uuid4()) is None


def test_the_body_gets_what_a_plain_delay_gives_it_in_a_worker(worker, unique_tag):
    values = [
        uuid.UUID("6fa459ea-ee8a-3ca4-894e-db77e160355e"),
        Decimal("1.10"),
        Decimal("-0E+3"),
        datetime(2024, 3, 1, 12, 30, 0, 5, tzinfo=UTC),
        datetime(2024, 3, 1, 12, 30),
        date(2024, 2, 29),
        time(8, 0, 0, 1),
    ]
    record_args.delay(f"{unique_tag}-delay", values)
    record_args.trigger(f"{unique_tag}-trigger", values)
    logs = wait_for(
        lambda: (
            {
                log.tag: log.payload
                for log in RunLog.objects.filter(
                    task="testapp.record_args", tag__startswith=unique_tag
                )
            }
            if RunLog.objects.filter(tag__startswith=unique_tag).count() == 2
            else None
        )
    )
    assert logs[f"{unique_tag}-trigger"] == logs[f"{unique_tag}-delay"]
    assert [t for t, _ in logs[f"{unique_tag}-trigger"]] == [
        "uuid.UUID",
        "decimal.Decimal",
        "decimal.Decimal",
        "datetime.datetime",
        "datetime.datetime",
        "datetime.date",
        "datetime.time",
    ]
