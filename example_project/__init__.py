"""The example site of django-debounce: a small catalogue whose saves trigger debounced work,
and ``manage.py demo``, which shows the difference against a real Celery worker.

The Celery app is imported here so that ``shared_task`` (and so ``debounced_task``) binds to it
in every process that loads Django, as the Celery "First steps with Django" guide recommends.
"""

from example_project.celery import app as celery_app

__all__ = ["celery_app"]
