"""Settings of the test suite: real PostgreSQL or SQLite (``DEBOUNCE_TEST_DB``), real Redis.

``scripts/test`` starts throwaway servers and exports their URLs. Without them only
``tests/unit/`` runs (these settings then name SQLite in a temporary file and no Redis); every
other test fails at once with ``NO_SERVERS`` (``clean_redis_state`` in tests/conftest.py),
never skips.
"""

import atexit
import os
import shutil
import tempfile
from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured

SERVERS = bool(os.environ.get("DEBOUNCE_TEST_REDIS_URL"))
NO_SERVERS = (
    "DEBOUNCE_TEST_REDIS_URL is not set. Run the suite with scripts/test, which starts "
    "throwaway Redis and PostgreSQL servers and exports their URLs (tests/README.md says how "
    "to point it at servers of your own); only tests/unit/ runs without them."
)


def _need(name: str, without_servers: str | None = None) -> str:
    value = os.environ.get(name)
    if value:
        return value
    if not SERVERS and without_servers is not None:
        return without_servers  # tests/unit/ only: never contacted
    raise ImproperlyConfigured(f"{name} is not set. {NO_SERVERS}")


SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_debounce",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DB_VENDOR = os.environ.get("DEBOUNCE_TEST_DB", "postgresql" if SERVERS else "sqlite")
IN_WORKER = os.environ.get("DEBOUNCE_TEST_WORKER") == "1"
REDIS_URL = _need("DEBOUNCE_TEST_REDIS_URL", "redis://127.0.0.1:1/0")
# The suite's Redis databases: N (REDIS_URL's), N + 1 (the broker) and N + 2 (the cache); the
# browser test's example site takes 6 and 7. scripts/test gives runs beside each other their
# own N.
_REDIS_BASE, _REDIS_DB = REDIS_URL.rsplit("/", 1)
_REDIS_DB_N = int(_REDIS_DB or 0)

if DB_VENDOR == "postgresql":
    pg = urlparse(_need("DEBOUNCE_TEST_POSTGRES_URL"))
    name = pg.path.lstrip("/")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": f"test_{name}" if IN_WORKER else name,
            "USER": pg.username or "postgres",
            "PASSWORD": pg.password or "",
            "HOST": pg.hostname,
            "PORT": pg.port,
            "TEST": {"NAME": f"test_{name}"},
        }
    }
elif DB_VENDOR == "sqlite":
    path = os.environ.get("DEBOUNCE_TEST_SQLITE_PATH", "")
    if not path:  # this process's own file (its workers inherit the path), removed at its exit
        folder = tempfile.mkdtemp(prefix="debounce-sqlite-")
        atexit.register(shutil.rmtree, folder, True)
        path = os.environ["DEBOUNCE_TEST_SQLITE_PATH"] = os.path.join(folder, "test.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": path,
            "TEST": {"NAME": path},
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL;",
                "timeout": 30,
            },
        }
    }
else:
    raise ImproperlyConfigured(
        f"DEBOUNCE_TEST_DB must be 'postgresql' or 'sqlite', not {DB_VENDOR!r}"
    )

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        # The failover test gives its worker a Redis of its own to stop and start.
        "LOCATION": os.environ.get("DEBOUNCE_TEST_CACHE_URL") or f"{_REDIS_BASE}/{_REDIS_DB_N + 2}",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
    }
}

# A broker database of its own, flushed at the start of every session.
CELERY_BROKER_URL = f"{_REDIS_BASE}/{_REDIS_DB_N + 1}"
CELERY_TASK_DEFAULT_QUEUE = "debounce-tests"
CELERY_TASK_ROUTES = {
    "testapp.failover": {"queue": "debounce-failover"},
    "testapp.crashy": {"queue": "debounce-crash"},
    "testapp.eta": {"queue": "debounce-eta"},
    "testapp.orphan": {"queue": "debounce-recovery"},
}
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# The ETA redelivery test gives its worker a short visibility timeout, so the Redis transport
# delivers an unacknowledged ETA message a second time.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
if os.environ.get("DEBOUNCE_TEST_VISIBILITY"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": float(os.environ["DEBOUNCE_TEST_VISIBILITY"]),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }

DEBOUNCE_BACKEND = os.environ.get("DEBOUNCE_TEST_BACKEND", "auto")
DEBOUNCE_DEFAULT_WAIT = 0.3
DEBOUNCE_LEASE = 60
# The lost-message test's worker takes a flight again after a one-second grace.
DEBOUNCE_DISPATCH_GRACE = float(os.environ.get("DEBOUNCE_TEST_DISPATCH_GRACE", 60))
# tests/worker/test_worker.py starts a worker without a pump.
DEBOUNCE_PUMP = os.environ.get("DEBOUNCE_TEST_PUMP", "1") == "1"
# The Redis Cluster leg of scripts/test: the Redis store on a 3-master cluster (the broker and
# the cache stay on the plain Redis).
if os.environ.get("DEBOUNCE_TEST_STORE_CLUSTER") == "1":
    DEBOUNCE_REDIS_CLUSTER = _need("DEBOUNCE_TEST_REDIS_CLUSTER").split(",")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_debounce": {"handlers": ["console"], "level": "WARNING"}},
}
