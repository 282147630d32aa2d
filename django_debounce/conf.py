"""The ``DEBOUNCE_`` settings (docs/settings.md), read when used so ``override_settings``
works."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    "BACKEND": "auto",
    "CACHE_ALIAS": "default",
    "DEFAULT_WAIT": 30,
    "LEASE": 300,
    "ON_COMMIT": True,
    "ENABLED": True,
    "ADMIN_ENABLED": True,
    "REDIS_URL": None,
    "REDIS_CLUSTER": None,
    "REDIS_PREFIX": "debounce",
    "DISPATCH_GRACE": 60,
    "PUMP": True,
    "PUMP_INTERVAL": 1.0,
    "PUMP_BATCH": 500,
    "PUMP_QUEUE_CAP": 1000,
    "MAX_PAYLOAD": 65536,
    "MAX_BATCH_PAYLOAD": 4194304,
}

_cache: dict[str, Any] = {}
generation = 0  # bumped by every change of a DEBOUNCE_ setting (caches elsewhere key on it)


def get(name: str) -> Any:
    """Return the value of setting ``DEBOUNCE_<name>``, or its default.

    Values are cached (every trigger reads several) and the cache is dropped on Django's
    ``setting_changed``, so ``override_settings`` works.
    """
    try:
        return _cache[name]
    except KeyError:
        return _cache.setdefault(name, getattr(settings, f"DEBOUNCE_{name}", DEFAULTS[name]))


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global generation
    if setting.startswith("DEBOUNCE_"):
        _cache.clear()
        generation += 1


# The shortest DEBOUNCE_PUMP_INTERVAL (a pump that never sleeps would spin on its store).
MIN_INTERVAL = 0.01

# The longest duration any setting or option may have (a year): longer is a mistake, and
# the stores count time in integer microseconds that must stay exact in a Lua number.
MAX_SECONDS = 365 * 86400.0


def seconds(
    value: Any, *, name: str, allow_none: bool = False, positive: bool = False
) -> float | None:
    """Normalise a duration given as seconds (int/float) or ``timedelta`` to float seconds.

    Raises ``ImproperlyConfigured`` for negative (with ``positive``: zero too), infinite, NaN
    or non-numeric values, and for more than ``MAX_SECONDS`` (a year), naming ``name``.
    """
    if value is None:
        if allow_none:
            return None
        raise ImproperlyConfigured(f"{name} must be a number of seconds or a timedelta, not None.")
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ImproperlyConfigured(
            f"{name} must be a number of seconds (int or float) or a timedelta, "
            f"got {value!r} of type {type(value).__name__}."
        )
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        least = "> 0" if positive else ">= 0"
        raise ImproperlyConfigured(
            f"{name} must be a finite number {least} seconds, got {value!r}."
        )
    if value > MAX_SECONDS:
        raise ImproperlyConfigured(
            f"{name} must be at most a year ({MAX_SECONDS:.0f} seconds), got {value!r}."
        )
    return float(value)


# Settings that are durations in seconds.
DURATIONS = ("DEFAULT_WAIT", "LEASE", "DISPATCH_GRACE", "PUMP_INTERVAL")


def seconds_of(name: str) -> float:
    """The duration setting ``DEBOUNCE_<name>`` in seconds.

    Raises ``ImproperlyConfigured`` naming the setting and the accepted forms (a lease of
    0 seconds included).
    """
    return seconds(get(name), name=f"DEBOUNCE_{name}", positive=name == "LEASE") or 0.0


def _count(least: int) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= least


def _url(value: Any, schemes: tuple[str, ...] = ("redis://", "rediss://", "unix://")) -> bool:
    return isinstance(value, str) and value.lower().startswith(schemes)


def _cluster(value: Any) -> bool:
    nodes = isinstance(value, (list, tuple)) and bool(value)
    nodes = nodes and all(re.fullmatch(r"[^:]*:\d+", str(n)) for n in value)
    return value is None or _url(value, ("redis://", "rediss://")) or nodes


SWITCH = (
    lambda value: isinstance(value, bool),
    "True or False (a string such as 'false' counts as true)",
)

# Every other setting: name -> (whether a value is of the right kind, what that kind is).
KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "ON_COMMIT": SWITCH,
    "ENABLED": SWITCH,
    "ADMIN_ENABLED": SWITCH,
    "PUMP": SWITCH,
    "MAX_PAYLOAD": (_count(1), "a positive int (bytes)"),
    "MAX_BATCH_PAYLOAD": (_count(1), "a positive int (bytes)"),
    "PUMP_BATCH": (_count(1), "a positive int (entries per take)"),
    "PUMP_QUEUE_CAP": (_count(0), "an int >= 0 (messages; 0: no cap)"),
    "REDIS_PREFIX": (
        lambda v: isinstance(v, str) and bool(v) and "{" not in v and "}" not in v,
        "a non-empty str without braces",
    ),
    "REDIS_URL": (lambda v: v is None or _url(v), "a redis://, rediss:// or unix:// URL"),
    "REDIS_CLUSTER": (_cluster, "a list of 'host:port' startup nodes or a redis:// URL of one"),
    "CACHE_ALIAS": (lambda v: isinstance(v, str), "a cache alias (str)"),
}


def problems() -> list[tuple[str, str]]:
    """``(setting, what is wrong and how to fix it)`` for every ``DEBOUNCE_`` setting with a
    value of the wrong kind (``DURATIONS`` and ``KINDS``), for the system check."""
    out = []
    for name in DURATIONS:
        try:
            seconds_of(name)
        except ImproperlyConfigured as exc:
            out.append((f"DEBOUNCE_{name}", str(exc)))
    if "DEBOUNCE_PUMP_INTERVAL" not in dict(out) and seconds_of("PUMP_INTERVAL") < MIN_INTERVAL:
        out.append(
            (
                "DEBOUNCE_PUMP_INTERVAL",
                f"DEBOUNCE_PUMP_INTERVAL must be at least {MIN_INTERVAL} seconds (a pump sleeps "
                "that long at most between two looks at the due index).",
            )
        )
    for name, (right, kind) in KINDS.items():
        value = get(name)
        if not right(value):
            out.append((f"DEBOUNCE_{name}", f"DEBOUNCE_{name} must be {kind}, got {value!r}."))
    return out
