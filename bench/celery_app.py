"""The Celery app of the comparison benchmark (workers load it with ``-A bench.celery_app``).

celery-once and celery-singleton are configured as their READMEs show, with their locks on the
store Redis (databases 3 and 4), so the broker's server carries only broker traffic.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

app = Celery("bench")
app.config_from_object("django.conf:settings", namespace="CELERY")
_store = os.environ["DEBOUNCE_TEST_REDIS_URL"].rsplit("/", 1)[0]
app.conf.ONCE = {
    "backend": "celery_once.backends.Redis",
    "settings": {"url": f"{_store}/3", "default_timeout": 60 * 60},
}
app.conf.singleton_backend_url = f"{_store}/4"
app.set_default()
