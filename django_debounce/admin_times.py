"""Times on the admin pages, in the zone Django's admin shows its own times in (``local``),
under a heading that names the zone (``labelled``; docs/design.md, "Times and USE_TZ")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, tzinfo
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.db import models
from django.utils import formats, timezone
from django.utils.functional import lazy
from django.utils.text import format_lazy


def zone() -> tzinfo:
    """The zone Django shows times in: the current one with ``USE_TZ``, else ``TIME_ZONE``
    (the zone of the naive times in the database)."""
    return timezone.get_current_timezone() if settings.USE_TZ else timezone.get_default_timezone()


def local(value: datetime) -> datetime:
    """``value`` (an aware ``datetime``) in ``zone()``, aware."""
    return timezone.localtime(value, zone())


def labelled(text: Any) -> str:
    """``text`` followed by the zone's name, such as ``"started (America/New_York)"``, lazily:
    a heading built once names the zone of each request that shows it."""
    return format_lazy("{} ({})", text, lazy(lambda: str(zone()), str)())


def time_column(field: models.Field, empty: str) -> Callable[[Any], str]:
    """A column or read-only field for the admin that shows the time in ``field`` (a
    ``DateTimeField`` giving aware times) as Django formats its own (``DATETIME_FORMAT``) in
    ``zone()``, headed by the field's name and the zone's, sorted by the field, and ``empty``
    when there is no time. Named as the field, so the page's CSS classes are unchanged."""

    @admin.display(description=labelled(field.verbose_name), ordering=field.name)
    def show(obj: Any) -> str:
        value = getattr(obj, field.name)
        return empty if value is None else formats.localize(local(value))

    show.__name__ = show.__qualname__ = field.name
    return show


def time_columns(model: type[models.Model], empty: str) -> dict[str, Callable[[Any], str]]:
    """``time_column`` of every ``DateTimeField`` of ``model``, by field name."""
    return {
        f.name: time_column(f, empty)
        for f in model._meta.fields
        if isinstance(f, models.DateTimeField)
    }
