"""The default store: the database backend until the Redis fast path is available."""

from __future__ import annotations

from django_debounce.backends.database import DatabaseBackend


class AutoBackend(DatabaseBackend):
    """``DEBOUNCE_BACKEND='auto'``: today the database store on every configuration."""

    name = "auto"
