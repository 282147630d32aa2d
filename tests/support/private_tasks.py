"""Debounced tasks registered in the test process only.

A pump takes only the due index entries of the tasks registered in its own process, so the
pump of the suite's worker (running whenever an earlier test of the session started it) never
takes the entries of these tasks: a test without a worker can leave flights due, or leases
run out, and find them as it left them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.app.routes import MapRoute
from django.db.models.signals import post_save

from django_debounce import RunInfo, debounced_receiver, debounced_task
from tests.celery_app import app


@contextmanager
def private_task(name: str, *, queue: str | None = None, **options: Any) -> Iterator[Any]:
    """A debounced task ``name`` whose body takes one ``tag`` and appends ``(tag, triggers)``
    to the task's ``ran`` list; ``options`` are those of ``debounced_task``. With ``queue``,
    its messages are routed to that queue (a queue no worker consumes keeps them in the
    broker). Unregistered on exit."""
    ran: list[tuple[str, int]] = []

    def body(tag: str, *, debounce: RunInfo) -> None:
        ran.append((tag, debounce.triggers))

    body.__name__ = body.__qualname__ = name.rsplit(".", 1)[-1]
    task = debounced_task(name=name, **options)(body)
    task.ran = ran
    # A route of its own, first in the list Celery's router reads (the `queue=` task
    # attribute is deprecated in Celery 5).
    routes = app.amqp.router.routes
    route = MapRoute({name: {"queue": queue}}) if queue else None
    if route is not None:
        routes.insert(0, route)
    try:
        yield task
    finally:
        if route is not None:
            routes.remove(route)
        app.tasks.pop(name, None)


@contextmanager
def private_receiver(name: str, sender: Any, **options: Any) -> Iterator[Any]:
    """A debounced ``post_save`` receiver of ``sender`` in this process only, whose handler
    appends its keywords to the task's ``calls``; disconnected on exit."""
    calls: list[dict[str, Any]] = []

    def handler(sender: Any, **kwargs: Any) -> None:
        calls.append(kwargs)

    handler.__name__ = handler.__qualname__ = name.rsplit(".", 1)[-1]
    task = debounced_receiver(post_save, sender=sender, name=name, **options)(handler)
    task.calls = calls
    try:
        yield task
    finally:
        post_save.disconnect(sender=sender, dispatch_uid=f"django_debounce:{name}")
        app.tasks.pop(name, None)
