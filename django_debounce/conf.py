"""Settings of django-debounce, read when used so ``override_settings`` works.

Every setting is flat and carries the ``DEBOUNCE_`` prefix (docs/design.md, "Public API";
every setting is described in docs/settings.md).
"""

from __future__ import annotations

import math
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
    # The Redis store's own client (instead of the cache alias's): a redis:// URL, or a list
    # of "host:port" startup nodes of a Redis Cluster.
    "REDIS_URL": None,
    "REDIS_CLUSTER": None,
    # Prefix of every Redis key of the Redis store (two deployments may share one Redis).
    "REDIS_PREFIX": "debounce",
    # Seconds a dispatch message may wait unclaimed before the pump takes its flight again
    # (with the same sequence number: a duplicate, never a second run).
    "DISPATCH_GRACE": 60,
    # The pump: every worker runs one in its main process (False: this worker runs none;
    # `manage.py debounce_pump` runs one on its own).
    "PUMP": True,
    # Longest sleep of a pump between two looks at the due index, in seconds; a flight due
    # within it of the step that makes it due is published at once with a countdown.
    "PUMP_INTERVAL": 1.0,
    # Entries one take of the pump handles at most.
    "PUMP_BATCH": 500,
    # Messages published and not yet claimed per queue above which a pump waits.
    "PUMP_QUEUE_CAP": 1000,
    # Bytes of JSON one trigger may store (its payload, or its item in collect mode).
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
        value = _cache[name] = getattr(settings, f"DEBOUNCE_{name}", DEFAULTS[name])
        return value


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


def seconds(value: Any, *, name: str, allow_none: bool = False) -> float | None:
    """Normalise a duration given as seconds (int/float) or ``timedelta`` to float seconds.

    Raises ``ImproperlyConfigured`` for negative, infinite, NaN or non-numeric values, and
    for more than ``MAX_SECONDS`` (a year), naming ``name``.
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
    if not math.isfinite(value) or value < 0:
        raise ImproperlyConfigured(f"{name} must be a finite number >= 0 seconds, got {value!r}.")
    if value > MAX_SECONDS:
        raise ImproperlyConfigured(
            f"{name} must be at most a year ({MAX_SECONDS:.0f} seconds), got {value!r}."
        )
    return float(value)


# Settings that are durations in seconds, and switches.
DURATIONS = ("DEFAULT_WAIT", "LEASE", "DISPATCH_GRACE", "PUMP_INTERVAL")
BOOLEANS = ("ON_COMMIT", "ENABLED", "ADMIN_ENABLED", "PUMP")


def seconds_of(name: str) -> float:
    """The duration setting ``DEBOUNCE_<name>`` in seconds.

    Raises ``ImproperlyConfigured`` naming the setting and the accepted forms.
    """
    return seconds(get(name), name=f"DEBOUNCE_{name}") or 0.0


def problems() -> list[tuple[str, str]]:
    """``(setting, what is wrong and how to fix it)`` for every ``DEBOUNCE_`` setting with a
    value of the wrong kind (durations, booleans, the cache alias), for the system check."""
    out = []
    for name in DURATIONS:
        try:
            seconds_of(name)
        except ImproperlyConfigured as exc:
            out.append((f"DEBOUNCE_{name}", str(exc)))
    if "DEBOUNCE_LEASE" not in dict(out) and seconds_of("LEASE") == 0:
        out.append(("DEBOUNCE_LEASE", "DEBOUNCE_LEASE must be more than 0 seconds."))
    for name in BOOLEANS:
        value = get(name)
        if not isinstance(value, bool):
            out.append(
                (
                    f"DEBOUNCE_{name}",
                    f"DEBOUNCE_{name} must be True or False, got {value!r} of type "
                    f"{type(value).__name__} (a string such as 'false' counts as true).",
                )
            )
    for name, unit in (
        ("MAX_PAYLOAD", "bytes"),
        ("MAX_BATCH_PAYLOAD", "bytes"),
        ("PUMP_BATCH", "entries per take"),
    ):
        value = get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            out.append(
                (
                    f"DEBOUNCE_{name}",
                    f"DEBOUNCE_{name} must be a positive int ({unit}), got {value!r}.",
                )
            )
    cap = get("PUMP_QUEUE_CAP")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        out.append(
            (
                "DEBOUNCE_PUMP_QUEUE_CAP",
                f"DEBOUNCE_PUMP_QUEUE_CAP must be an int >= 0 (messages; 0: no cap), got {cap!r}.",
            )
        )
    if "DEBOUNCE_PUMP_INTERVAL" not in dict(out) and seconds_of("PUMP_INTERVAL") < MIN_INTERVAL:
        out.append(
            (
                "DEBOUNCE_PUMP_INTERVAL",
                f"DEBOUNCE_PUMP_INTERVAL must be at least {MIN_INTERVAL} seconds (a pump sleeps "
                "that long at most between two looks at the due index).",
            )
        )
    prefix = get("REDIS_PREFIX")
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        out.append(
            (
                "DEBOUNCE_REDIS_PREFIX",
                f"DEBOUNCE_REDIS_PREFIX must be a non-empty str without braces, got {prefix!r}.",
            )
        )
    url = get("REDIS_URL")
    if url is not None and not (isinstance(url, str) and "://" in url):
        out.append(
            ("DEBOUNCE_REDIS_URL", f"DEBOUNCE_REDIS_URL must be a redis:// URL, got {url!r}.")
        )
    cluster = get("REDIS_CLUSTER")
    if cluster is not None and not (
        isinstance(cluster, str)
        or (isinstance(cluster, (list, tuple)) and cluster and all(":" in str(n) for n in cluster))
    ):
        out.append(
            (
                "DEBOUNCE_REDIS_CLUSTER",
                "DEBOUNCE_REDIS_CLUSTER must be a list of 'host:port' startup nodes or a "
                f"redis:// URL of one, got {cluster!r}.",
            )
        )
    if not isinstance(get("CACHE_ALIAS"), str):
        out.append(("DEBOUNCE_CACHE_ALIAS", "DEBOUNCE_CACHE_ALIAS must be a cache alias (str)."))
    return out
