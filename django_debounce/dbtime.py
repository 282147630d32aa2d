"""Times between this app and the database, whatever ``USE_TZ`` says: inside the app every
time is an aware UTC ``datetime``; ``to_db`` and ``from_db`` are the one crossing (the model
fields and the stores' raw SQL use them; docs/design.md, "Times and USE_TZ")."""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.dateparse import parse_datetime


def now() -> datetime:
    """The current time, aware, in UTC (Django's ``timezone.now()`` is naive under
    ``USE_TZ = False``)."""
    return datetime.now(UTC)


def db_zone() -> tzinfo:
    """The zone of the naive times in the database: UTC with ``USE_TZ``, else ``TIME_ZONE``."""
    return UTC if settings.USE_TZ else timezone.get_default_timezone()


def to_db(value: datetime) -> datetime:
    """``value`` as Django stores it: aware with ``USE_TZ``, else naive in ``TIME_ZONE``
    (a naive ``value`` is taken as already in that form)."""
    if settings.USE_TZ or timezone.is_naive(value):
        return value
    return timezone.make_naive(value, db_zone())


def from_db(value: datetime | str | None) -> datetime | None:
    """An aware UTC datetime of a time read from the database (a ``datetime``, or SQLite's
    text); naive values are in ``db_zone()``. ``None`` stays ``None``."""
    if value is None:
        return None
    at = parse_datetime(value) if isinstance(value, str) else value
    if at is None:
        raise ValueError(f"not a time: {value!r}")
    if timezone.is_naive(at):
        at = at.replace(tzinfo=UTC) if settings.USE_TZ else timezone.make_aware(at, db_zone())
    return at.astimezone(UTC)


class AwareDateTimeField(models.DateTimeField):
    """A ``DateTimeField`` that takes and gives aware UTC datetimes under either ``USE_TZ``
    (see the module's docstring). Migrations see a plain ``DateTimeField``: the column is the
    same."""

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if isinstance(value, datetime):
            value = to_db(value)
        return super().get_db_prep_value(value, connection, prepared)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> datetime | None:
        return from_db(value)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.DateTimeField", args, kwargs
