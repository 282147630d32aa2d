"""``manage.py demo``: real saves, a real Celery worker, four ways of handling a burst."""
