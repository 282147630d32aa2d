"""``django_debounce.trigger``: a Celery task that triggers a registered debounced task by
name (docs/guide/integration.md, "Beat, send_task and canvas")."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from django_debounce import registry


@shared_task(name="django_debounce.trigger", ignore_result=True, serializer="json")
def trigger(
    task_name: str, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Trigger the registered debounced task ``task_name`` with ``args`` and ``kwargs``.

    Returns the ``TriggerResult`` as a dict (``key``, ``flight_id``, ``pending``, ``due_at``
    ISO text, ``scheduled``). Raises ``UnknownTask`` when ``task_name`` is not a registered
    debounced task, and what ``trigger()`` raises (``TypeError`` for arguments that do not
    fit) — both fail this Celery task, visibly.
    """
    task = registry.get(str(task_name))
    if not isinstance(args or [], list) or not isinstance(kwargs or {}, dict):
        raise TypeError(
            "django_debounce.trigger takes (task name, list of arguments, dict of keyword "
            f"arguments), got args={args!r} kwargs={kwargs!r}."
        )
    result = task.trigger(*(args or []), **(kwargs or {}))
    return {
        "key": result.key,
        "flight_id": result.flight_id,
        "pending": result.pending,
        "due_at": result.due_at.isoformat() if result.due_at else None,
        "scheduled": result.scheduled,
        "deferred": result.deferred,
    }
