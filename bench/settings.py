"""Settings of the benchmarks: the PostgreSQL and Redis servers that scripts/bench starts.

``DEBOUNCE_TEST_REDIS_URL`` is the store Redis (debounce state, counters, lock libraries);
``BENCH_BROKER_URL`` (optional) gives the Celery broker a Redis server of its own, so its
commands and memory can be counted apart; ``bench/compare.py`` starts one.
"""

import os
from urllib.parse import urlparse

pg = urlparse(os.environ["DEBOUNCE_TEST_POSTGRES_URL"])
REDIS = os.environ["DEBOUNCE_TEST_REDIS_URL"].rsplit("/", 1)[0]

SECRET_KEY = "bench"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_debounce",
    "bench",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": pg.path.lstrip("/"),
        "USER": pg.username or "postgres",
        "HOST": pg.hostname,
        "PORT": pg.port,
    }
}
CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": f"{REDIS}/2"}}
CELERY_BROKER_URL = os.environ.get("BENCH_BROKER_URL") or f"{REDIS}/1"
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "bench"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
DEBOUNCE_BACKEND = "auto"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_debounce": {"handlers": ["console"], "level": "WARNING"}},
}
