"""The registered debounced tasks, read from ``current_app.tasks`` every time it is asked
(docs/design.md, "Layers")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import current_app

from django_debounce.exceptions import UnknownTask
from django_debounce.state import FlightOptions


def is_debounced(task: object) -> bool:
    """Whether ``task`` is a debounced task (an instance of a ``DebouncedTask`` class)."""
    return getattr(type(task), "__debounced__", False) is True


def all_tasks() -> dict[str, Any]:
    """Celery name -> task of every debounced task registered in the current Celery app."""
    return {name: task for name, task in current_app.tasks.items() if is_debounced(task)}


def names() -> set[str]:
    """Celery names of the debounced tasks registered in the current Celery app."""
    return set(all_tasks())


def get(name: str) -> Any:
    """The registered debounced task called ``name``.

    Raises ``UnknownTask`` for names that are not registered debounced tasks, so a name read
    from the database or a message never dispatches an arbitrary task.
    """
    task = current_app.tasks.get(name)
    if not is_debounced(task):
        raise UnknownTask(
            f"{name!r} is not a registered debounced task in Celery app {current_app.main!r}; "
            "import the module that defines it; if it was removed or renamed, drop its "
            "pending triggers with `manage.py debounce_purge --older-than 7d --unregistered` "
            '(or the admin action "Cancel pending triggers").'
        )
    return task


def options(tasks: Mapping[str, Any] | None = None) -> dict[str, FlightOptions]:
    """Celery name -> ``FlightOptions`` of ``tasks`` (name -> task; default: every registered
    debounced task), as the stores take them."""
    tasks = all_tasks() if tasks is None else tasks
    return {name: task.flight_options() for name, task in tasks.items()}


def by_store(tasks: Mapping[str, Any] | None = None) -> dict[Any, dict[str, Any]]:
    """``tasks`` (name -> task; default: every registered debounced task) grouped by the store
    that holds their keys: store (a ``BaseBackend``) -> name -> task. Each task names its
    store itself (``task.get_backend()``), so the registry loads none."""
    tasks = all_tasks() if tasks is None else tasks
    out: dict[Any, dict[str, Any]] = {}
    for name, task in tasks.items():
        out.setdefault(task.get_backend(), {})[name] = task
    return out


__all__ = ["all_tasks", "by_store", "get", "is_debounced", "names", "options"]
