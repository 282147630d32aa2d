"""The Celery app of the example site (``celery -A example_project worker``)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
# Every CELERY_* Django setting configures the app (CELERY_BROKER_URL -> broker_url, ...).
app.config_from_object("django.conf:settings", namespace="CELERY")
# Finds the tasks.py of every installed app (catalogue, demo).
app.autodiscover_tasks()
