"""Settings of the example site.

Defaults need no server: SQLite in ``example_project/var/`` and kombu's filesystem broker in
``example_project/var/broker/``. Environment overrides:

- ``DATABASE_URL``: ``postgres://user:password@host:port/name`` (PostgreSQL) or
  ``sqlite:////absolute/path.sqlite3``;
- ``CELERY_BROKER_URL``: e.g. ``redis://localhost:6379/5`` (any broker URL Celery knows);
- ``REDIS_URL``: a django-redis default cache, so django-debounce keeps its state in Redis;
- ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG`` (``0``/``1``), ``DJANGO_ALLOWED_HOSTS`` (comma list);
- ``CATALOGUE_SEARCH_WAIT``, ``CATALOGUE_STATS_WAIT``: the catalogue's debounce waits (seconds).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

PACKAGE_DIR = Path(__file__).resolve().parent
BASE_DIR = PACKAGE_DIR.parent
VAR_DIR = PACKAGE_DIR / "var"  # git-ignored; created on demand

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-insecure-key-do-not-deploy")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = [
    h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",") if h
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_debounce",
    "example_project.catalogue",
    "example_project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


# -- database -------------------------------------------------------------------------------


def database_from_url(url: str) -> dict:
    """A ``DATABASES`` entry for a ``postgres://`` or ``sqlite://`` URL."""
    parsed = urlparse(url)
    if parsed.scheme in ("postgres", "postgresql", "pgsql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path.lstrip("/")),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
        }
    if parsed.scheme == "sqlite":
        # sqlite:////abs/path.sqlite3 (or sqlite:///relative/to/repo.sqlite3)
        path = unquote(parsed.path)
        if path.startswith("//"):
            path = path[1:]
        elif path.startswith("/"):
            path = str(BASE_DIR / path.lstrip("/"))
        return sqlite_database(Path(path))
    raise ImproperlyConfigured(
        f"DATABASE_URL scheme {parsed.scheme!r} is not supported; use postgres://... or sqlite:///..."
    )


def sqlite_database(path: Path) -> dict:
    """SQLite as django-debounce wants it: immediate transactions, WAL, a busy timeout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {
            # Writers (web process, every worker process) queue for SQLite's one write lock
            # instead of failing with "database is locked" (django_debounce.W002).
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL;",
            "timeout": 30,
        },
    }


DATABASE_URL = os.environ.get("DATABASE_URL", "")
DATABASES = {
    "default": database_from_url(DATABASE_URL)
    if DATABASE_URL
    else sqlite_database(VAR_DIR / "db.sqlite3")
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# REDIS_URL=redis://host:6379/3 makes the default cache django-redis, and with it the
# django-debounce "auto" store uses Redis; without it the state lives in the database.
REDIS_URL = os.environ.get("REDIS_URL", "")
CACHES = {
    "default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL}
    if REDIS_URL
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"


# -- Celery ---------------------------------------------------------------------------------

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or "filesystem://localhost//"
if CELERY_BROKER_URL.startswith("filesystem://"):
    BROKER_DIR = VAR_DIR / "broker"
    for _sub in ("queue", "processed", "control"):
        (BROKER_DIR / _sub).mkdir(parents=True, exist_ok=True)
    # kombu's filesystem transport, writing each message atomically (see example_project/broker.py).
    CELERY_BROKER_TRANSPORT = "example_project.broker:FilesystemTransport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Producers write to data_folder_out, consumers read data_folder_in: one shared folder.
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        # kombu's name for it is processed_folder (Celery's docs say data_folder_processed).
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
        "control_folder": str(BROKER_DIR / "control"),
        # The worker polls the folder; 10 ms keeps dispatch latency low.
        "polling_interval": 0.01,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}

CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Dispatch messages carry countdowns (ETAs). With a transport that has no event loop (the
# filesystem one), the worker keeps ETAs in a timer thread that sleeps up to this many seconds
# at a time, without waking for an earlier entry: Celery's default of 1.0 would start a
# debounced run up to a second late whenever any later ETA is pending.
CELERY_WORKER_TIMER_PRECISION = 0.01
CELERY_TIMEZONE = TIME_ZONE


# -- django-debounce ------------------------------------------------------------------------

DEBOUNCE_BACKEND = "auto"
DEBOUNCE_LEASE = 60

# Quiet periods of the catalogue's debounced work, in seconds. The browser test lengthens them
# (CATALOGUE_SEARCH_WAIT=600) so that a burst of admin saves stays pending until "Run now".
CATALOGUE_SEARCH_WAIT = float(os.environ.get("CATALOGUE_SEARCH_WAIT", "2"))
CATALOGUE_STATS_WAIT = float(os.environ.get("CATALOGUE_STATS_WAIT", "5"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_debounce": {"handlers": ["console"], "level": "WARNING"}},
}
