"""The argument types a payload carries beyond JSON: those of Django's ``DjangoJSONEncoder``,
each in one canonical form so that one value is one key (docs/guide/integration.md,
"Payloads"), stored in the envelope of Celery's JSON serializer
(``{"__type__": name, "__value__": text}``) and decoded back for the body."""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Callable
from typing import Any

from django.utils.dateparse import parse_duration
from django.utils.duration import duration_iso_string
from django.utils.functional import Promise

TYPE, VALUE = "__type__", "__value__"

# What a payload may hold besides JSON's own types (for error messages and ``_offender``).
SUPPORTED: tuple[type, ...] = (
    datetime.date,  # datetime.datetime too
    datetime.time,
    datetime.timedelta,
    decimal.Decimal,
    uuid.UUID,
    Promise,
)
SUPPORTED_NAMES = "datetime, date, time, timedelta, Decimal or UUID"


def _datetime(value: datetime.datetime) -> str:
    if value.utcoffset() is None:
        return value.isoformat()  # naive: as given (no zone to convert from)
    try:
        return value.astimezone(datetime.UTC).isoformat()
    except OverflowError:
        raise ValueError(f"{value!r} is out of range in UTC") from None


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
    if isinstance(value, datetime.datetime):
        return {TYPE: "datetime", VALUE: _datetime(value)}
    if isinstance(value, datetime.date):
        return {TYPE: "date", VALUE: value.isoformat()}
    if isinstance(value, datetime.time):
        return {TYPE: "time", VALUE: value.isoformat()}
    if isinstance(value, datetime.timedelta):
        return {TYPE: "timedelta", VALUE: duration_iso_string(value)}
    if isinstance(value, decimal.Decimal):
        return {TYPE: "decimal", VALUE: str(value)}
    if isinstance(value, uuid.UUID):
        return {TYPE: "uuid", VALUE: str(value)}
    if isinstance(value, Promise):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _timedelta(text: str) -> datetime.timedelta:
    parsed = parse_duration(text)
    if parsed is None:
        raise ValueError(f"not an ISO 8601 duration: {text!r}")
    return parsed


_DECODERS: dict[str, Callable[[str], Any]] = {
    "datetime": datetime.datetime.fromisoformat,
    "date": datetime.date.fromisoformat,
    "time": datetime.time.fromisoformat,
    "timedelta": _timedelta,
    "decimal": decimal.Decimal,
    "uuid": uuid.UUID,
}


def decode(value: Any) -> Any:
    """``value`` (a payload as JSON decodes it) with every envelope that ``encode`` made
    turned back into its typed value; anything else is returned as it is."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 2 and TYPE in value and VALUE in value:
            decoder = _DECODERS.get(value[TYPE])
            if decoder is not None and isinstance(value[VALUE], str):
                return decoder(value[VALUE])
        return {k: decode(v) for k, v in value.items()}
    return value
