"""Store selection: the active backend is imported once and cached; the cache is dropped
on Django's ``setting_changed`` so ``override_settings`` works (as django-axes does)."""

from __future__ import annotations

import threading
from functools import cache

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_debounce import conf
from django_debounce.backends.base import BaseBackend

ALIASES = {
    "database": "django_debounce.backends.database.DatabaseBackend",
    "redis": "django_debounce.backends.redis.RedisBackend",
}


def backend_path(value: str | None = None) -> str:
    """Dotted path of the backend class named by ``value`` or ``DEBOUNCE_BACKEND``; ``auto``
    is the Redis store when a Redis is configured for it, else the database store (decided
    when the store is loaded, never by failover at run time)."""
    value = value or conf.get("BACKEND")
    if value == "auto":
        from django_debounce.backends.redis import redis_configured

        value = "redis" if redis_configured() else "database"
    return ALIASES.get(value, value)


def backend_class(path: str) -> type[BaseBackend]:
    """The store class at the dotted ``path``. Raises ``ImproperlyConfigured`` naming the
    accepted values when it cannot be imported or is not a ``BaseBackend`` subclass."""
    accepted = (
        "Use 'auto', 'redis' (with django-redis installed), 'database', or the dotted path of "
        "a subclass of django_debounce.backends.base.BaseBackend."
    )
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"DEBOUNCE_BACKEND={path!r} cannot be imported ({exc}). {accepted}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, BaseBackend)):
        raise ImproperlyConfigured(f"DEBOUNCE_BACKEND={path!r} is not a store class. {accepted}")
    return cls


@cache
def _load(path: str) -> BaseBackend:
    return backend_class(path)()


_by_name: dict[str | None, BaseBackend] = {}
_generation = 0  # bumped by every relevant setting change
_lock = threading.Lock()


def get_backend(name: str | None = None) -> BaseBackend:
    """The backend instance for ``name`` (a setting value or dotted path), or the configured one.

    Raises ``ImproperlyConfigured`` when the path cannot be imported.
    """
    try:
        return _by_name[name]  # every trigger asks: one dict lookup
    except KeyError:
        pass
    generation = _generation
    backend = _load(backend_path(name))
    with _lock:
        # a setting that changed while this thread read the old one must not be cached over
        if generation == _generation:
            _by_name[name] = backend
    return backend


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: object) -> None:
    global _generation
    if setting.startswith("DEBOUNCE_") or setting in ("CACHES", "DATABASES", "DATABASE_ROUTERS"):
        with _lock:
            _generation += 1
            _by_name.clear()
            _load.cache_clear()
