"""The canonical JSON of typed arguments (argtypes.py, keys.dumps): one form per value, and a
round trip that gives the body what Celery's JSON serializer (kombu) gives a ``.delay()``."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest
from django.utils.translation import gettext_lazy
from kombu.utils import json as kombu_json

from django_debounce import argtypes
from django_debounce.exceptions import UnsupportedArgument
from django_debounce.keys import dumps

KOMBU_TYPED = [
    uuid.UUID("6fa459ea-ee8a-3ca4-894e-db77e160355e"),
    Decimal("1.10"),
    Decimal("-0"),
    Decimal("1E+2"),
    Decimal("NaN"),
    datetime(2024, 3, 1, 12, 30, 0, 1, tzinfo=UTC),
    datetime(2024, 3, 1, 12, 30),
    datetime(1, 1, 1),
    date(2024, 2, 29),
    time(0, 0),
    time(23, 59, 59, 999999),
    time(8, 0, tzinfo=timezone(timedelta(hours=2))),
]


def round_trip(value):
    return argtypes.decode(json.loads(dumps(value)))


@pytest.mark.parametrize("value", KOMBU_TYPED, ids=repr)
def test_a_typed_value_comes_back_as_kombus_json_gives_it(value):
    via_celery = kombu_json.loads(kombu_json.dumps(value))
    got = round_trip(value)
    assert type(got) is type(via_celery)
    assert repr(got) == repr(via_celery)


@pytest.mark.parametrize(
    "value",
    [timedelta(0), timedelta(microseconds=1), timedelta(days=-1, seconds=5), timedelta.max,
     timedelta.min, timedelta(days=3, hours=4, minutes=5, seconds=6, microseconds=7)],
    ids=str,
)  # fmt: skip
def test_a_timedelta_comes_back_equal(value):
    # Celery's JSON cannot send a timedelta: it comes back as the value given.
    assert round_trip(value) == value


@pytest.mark.parametrize(
    "value, stored",
    [
        (uuid.UUID("6FA459EA-EE8A-3CA4-894E-DB77E160355E"), "6fa459ea-ee8a-3ca4-894e-db77e160355e"),
        (Decimal("1.10"), "1.10"),
        (Decimal("1.1"), "1.1"),
        (datetime(2024, 7, 1, 14, tzinfo=timezone(timedelta(hours=2))), "2024-07-01T12:00:00+00:00"),  # noqa: E501
        (datetime(2024, 7, 1, 12, tzinfo=UTC), "2024-07-01T12:00:00+00:00"),
        (datetime(2024, 7, 1, 14), "2024-07-01T14:00:00"),
        (datetime(2024, 7, 1, 14, 0, 0, 120000), "2024-07-01T14:00:00.120000"),
        (date(2024, 7, 1), "2024-07-01"),
        (time(9, 5), "09:05:00"),
        (timedelta(days=1, hours=2), "P1DT02H00M00S"),
        (timedelta(seconds=-1), "-P0DT00H00M01S"),
    ],
    ids=repr,
)  # fmt: skip
def test_the_canonical_form_of_each_type(value, stored):
    assert json.loads(dumps(value)) == {"__type__": argtypes.encode(value)["__type__"],
                                        "__value__": stored}  # fmt: skip


def test_one_instant_is_one_key_and_a_decimal_keeps_its_digits():
    plus_two = timezone(timedelta(hours=2))
    assert dumps(datetime(2024, 7, 1, 14, tzinfo=plus_two)) == dumps(
        datetime(2024, 7, 1, 12, tzinfo=UTC)
    )
    assert dumps(datetime(2024, 7, 1, 14)) != dumps(datetime(2024, 7, 1, 14, tzinfo=UTC))
    assert dumps(Decimal("1.10")) != dumps(Decimal("1.1"))


def test_a_lazy_string_is_stored_as_its_text():
    assert dumps([gettext_lazy("hello")]) == '["hello"]'


def test_values_that_only_look_like_an_envelope_are_left_alone():
    for value in [
        {"__type__": "mystery", "__value__": "x"},
        {"__type__": "uuid", "__value__": 5},
        {"__type__": "uuid", "__value__": "x", "other": 1},
        # an envelope of a known type whose text is no such value: the caller's own dict
        {"__type__": "uuid", "__value__": "not-a-uuid"},
        {"__type__": "decimal", "__value__": "abc"},
        {"__type__": "datetime", "__value__": "garbage"},
        {"__type__": "timedelta", "__value__": "soon"},
    ]:
        assert round_trip(value) == value


@pytest.mark.parametrize(
    "value, type_name",
    [(object(), "object"), ({1, 2}, "set"), (b"x", "bytes"), ([1, [float("nan")]], "float"),
     ({"k": {uuid.uuid4(): 1}}, "UUID"), (1j, "complex")],
    ids=repr,
)  # fmt: skip
def test_anything_else_is_an_error_naming_its_type_and_the_fix(value, type_name):
    with pytest.raises(UnsupportedArgument, match=f"type {type_name} ") as info:
        dumps({"args": [value], "kwargs": {}})
    assert isinstance(info.value, TypeError)
    assert "primary key instead of a model instance" in str(info.value)
    assert "UUID" in str(info.value)


def test_a_list_that_holds_itself_is_an_error_not_a_recursion():
    loop: list = []
    loop.append(loop)
    with pytest.raises(UnsupportedArgument, match="Circular reference"):
        dumps(loop)


def test_an_aware_datetime_with_no_utc_form_is_an_error_naming_it():
    late = datetime.max.replace(tzinfo=timezone(-timedelta(hours=2)))
    with pytest.raises(UnsupportedArgument, match="has no UTC form") as info:
        dumps({"args": [late], "kwargs": {}})
    assert "type dict" not in str(info.value)  # before: "cannot encode a value of type dict"
    assert "9999" in str(info.value)
