"""Settings of a project with two databases (tests/commands/test_two_databases.py runs the
commands under them in a subprocess): ``default`` and ``other``, both SQLite files named by
the environment; ``DEBOUNCE_TEST_ROUTE`` names a router of this module to use:
``DebounceOnOther`` (this app's tables on ``other``) or ``ItemsOnOther`` (the test app's
models on ``other``)."""

import os

from tests.settings import *  # noqa: F403

DATABASES = {
    alias: {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ[f"DEBOUNCE_TEST_{alias.upper()}_PATH"],
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
    }
    for alias in ("default", "other")
}
DEBOUNCE_BACKEND = "database"


class DebounceOnOther:
    """Route django_debounce's models to ``other``, everything else to ``default``."""

    def db_for_read(self, model, **hints):
        return "other" if model._meta.app_label == "django_debounce" else None

    db_for_write = db_for_read

    def allow_migrate(self, db, app_label, **hints):
        if app_label == "django_debounce":
            return db == "other"
        return db == "default"


class ItemsOnOther:
    """Route the test app's models to ``other``, everything else to ``default``."""

    def db_for_read(self, model, **hints):
        return "other" if model._meta.app_label == "testapp" else None

    db_for_write = db_for_read

    def allow_migrate(self, db, app_label, **hints):
        return db == ("other" if app_label == "testapp" else "default")


ROUTER = os.environ.get("DEBOUNCE_TEST_ROUTE", "")
if ROUTER:
    DATABASE_ROUTERS = [f"tests.settings_two_databases.{ROUTER}"]
