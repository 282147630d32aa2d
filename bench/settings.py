"""Settings of the benchmarks: the PostgreSQL and Redis servers that scripts/bench starts."""

import os
from urllib.parse import urlparse

pg = urlparse(os.environ["DEBOUNCE_TEST_POSTGRES_URL"])
REDIS = os.environ["DEBOUNCE_TEST_REDIS_URL"].rsplit("/", 1)[0]

SECRET_KEY = "bench"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_debounce"]
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
CELERY_BROKER_URL = f"{REDIS}/1"
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
DEBOUNCE_BACKEND = "auto"
