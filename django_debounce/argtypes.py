"""The argument types a payload carries beyond JSON (docs/guide/integration.md, "Payloads"),
in the envelope of Celery's JSON serializer (``{"__type__": name, "__value__": text}``)."""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Callable
from typing import Any

from django.utils.dateparse import parse_duration
from django.utils.duration import duration_iso_string
from django.utils.functional import Promise

from django_debounce.exceptions import UnsupportedArgument

TYPE, VALUE = "__type__", "__value__"


def _datetime(value: datetime.datetime) -> str:
    if value.utcoffset() is None:
        return value.isoformat()  # naive: as given (no zone to convert from)
    try:
        return value.astimezone(datetime.UTC).isoformat()
    except OverflowError:
        raise UnsupportedArgument(
            f"django-debounce stores an aware datetime in UTC, and {value!r} has no UTC form "
            "(it falls after year 9999 or before year 1 there): pass one within range."
        ) from None


def _timedelta(text: str) -> datetime.timedelta:
    parsed = parse_duration(text)
    if parsed is None:
        raise ValueError(f"not an ISO 8601 duration: {text!r}")
    return parsed


# Each type a payload may hold beyond JSON, declared once: (class, name in the envelope, its
# canonical text, the value of a text); a datetime before a date (a datetime is a date).
TYPES: tuple[tuple[type, str, Callable[[Any], str], Callable[[str], Any]], ...] = (
    (datetime.datetime, "datetime", _datetime, datetime.datetime.fromisoformat),
    (datetime.date, "date", datetime.date.isoformat, datetime.date.fromisoformat),
    (datetime.time, "time", datetime.time.isoformat, datetime.time.fromisoformat),
    (datetime.timedelta, "timedelta", duration_iso_string, _timedelta),
    (decimal.Decimal, "decimal", str, decimal.Decimal),
    (uuid.UUID, "uuid", str, uuid.UUID),
)
_DECODERS = {name: from_text for _cls, name, _to_text, from_text in TYPES}

# What a payload may hold besides JSON's own types (for error messages and ``_offender``).
SUPPORTED: tuple[type, ...] = (*(cls for cls, *_rest in TYPES), Promise)
SUPPORTED_NAMES = "datetime, date, time, timedelta, Decimal or UUID"


def encode(value: Any) -> Any:
    """The JSON form of a ``SUPPORTED`` value (the encoder's ``default``); raises
    ``TypeError`` for any other, as ``json.JSONEncoder.default`` does.

    Canonical forms: an aware ``datetime`` in UTC (ISO 8601, ``+00:00``; so 12:00+02:00 and
    10:00Z are one key), a naive one and a ``time`` as given (``isoformat()``, microseconds
    kept), a ``date`` as ``YYYY-MM-DD``, a ``timedelta`` as an ISO 8601 duration
    (``P1DT02H00M00S``), a ``Decimal`` as ``str()`` (its digits as written: ``Decimal("1.10")``
    and ``Decimal("1.1")`` are two keys, as ``1`` and ``1.0`` are), a ``UUID`` lower-case
    hyphenated, a lazy string as its text (a plain ``str``, as Celery sends it).
    """
    for cls, name, to_text, _from_text in TYPES:
        if isinstance(value, cls):
            return {TYPE: name, VALUE: to_text(value)}
    if isinstance(value, Promise):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def decode(value: Any) -> Any:
    """``value`` (a payload as JSON decodes it) with every envelope that ``encode`` made
    turned back into its typed value; anything else is returned as it is."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 2 and TYPE in value and VALUE in value:
            decoder = _DECODERS.get(value[TYPE])
            if decoder is not None and isinstance(value[VALUE], str):
                try:
                    return decoder(value[VALUE])
                except (ValueError, ArithmeticError):  # a dict of the caller's own, as sent
                    pass
        return {k: decode(v) for k, v in value.items()}
    return value
