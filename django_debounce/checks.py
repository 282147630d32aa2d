"""The system checks ``django_debounce.E001``-``E002`` and ``W001``-``W004`` (the list:
docs/operations.md)."""

from __future__ import annotations

import difflib
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_debounce import conf
from django_debounce.backends import backend_class, backend_path


@checks.register()
def check_backend(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E001 when ``DEBOUNCE_BACKEND`` cannot be imported; W001 when the redis backend is set
    on a cache alias that is not django-redis."""
    value = conf.get("BACKEND")
    try:
        backend_class(backend_path(value))
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="django_debounce.E001")]
    if conf.get("REDIS_URL") or conf.get("REDIS_CLUSTER"):
        return []  # the Redis store has a client of its own: the cache alias is not used
    alias = conf.get("CACHE_ALIAS")
    errors: list[checks.CheckMessage] = []
    if value == "auto" and isinstance(alias, str) and alias not in settings.CACHES:
        errors.append(
            checks.Warning(
                f"DEBOUNCE_CACHE_ALIAS={alias!r} is not an alias in CACHES, so the auto "
                "store always uses the database.",
                hint=f"Use one of {sorted(settings.CACHES)!r} (a django-redis cache for the "
                "Redis store), or set DEBOUNCE_BACKEND='database' to say so.",
                id="django_debounce.W004",
            )
        )
    if value == "redis":
        backend = settings.CACHES.get(alias, {}).get("BACKEND", "")
        if not backend.startswith("django_redis."):
            errors.append(
                checks.Warning(
                    f"DEBOUNCE_BACKEND='redis' uses cache alias {alias!r}, whose backend "
                    f"{backend!r} is not django-redis and has no atomic scripts.",
                    hint="Point DEBOUNCE_CACHE_ALIAS at a django_redis.cache.RedisCache alias, "
                    "or use DEBOUNCE_BACKEND='database'.",
                    id="django_debounce.W001",
                )
            )
    return errors


@checks.register(checks.Tags.database)
def check_sqlite(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W002 when a SQLite database has no ``transaction_mode`` of IMMEDIATE."""
    return sqlite_warnings(settings.DATABASES)


def sqlite_warnings(databases: dict[str, dict[str, Any]]) -> list[checks.CheckMessage]:
    """The W002 warnings for a ``DATABASES``-shaped dict."""
    out: list[checks.CheckMessage] = []
    for alias, db in databases.items():
        if "sqlite" not in db.get("ENGINE", ""):
            continue
        mode = str(db.get("OPTIONS", {}).get("transaction_mode", "")).upper()
        if mode != "IMMEDIATE":
            out.append(
                checks.Warning(
                    f"SQLite database {alias!r} uses deferred transactions; several worker "
                    "processes writing at once can fail with 'database is locked'.",
                    hint="Set OPTIONS={'transaction_mode': 'IMMEDIATE', 'init_command': "
                    "'PRAGMA journal_mode=WAL;', 'timeout': 20} on that database.",
                    id="django_debounce.W002",
                )
            )
    return out


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E002 for a ``DEBOUNCE_`` setting of the wrong kind (found at startup rather than at the
    first trigger or in a worker); W003 for a ``DEBOUNCE_`` setting this app does not know."""
    out: list[checks.CheckMessage] = [
        checks.Error(
            message,
            hint="See the settings reference, docs/settings.md.",
            obj=name,
            id="django_debounce.E002",
        )
        for name, message in conf.problems()
    ]
    known = {f"DEBOUNCE_{name}" for name in conf.DEFAULTS}
    for name in dir(settings):
        if name.startswith("DEBOUNCE_") and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            out.append(
                checks.Warning(
                    f"{name} is not a django-debounce setting and is ignored.",
                    hint=f"Did you mean {close[0]}?" if close else "See docs/settings.md.",
                    obj=name,
                    id="django_debounce.W003",
                )
            )
    return out
