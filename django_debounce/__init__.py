"""django-debounce: run slow Celery work once per burst of Django model saves.

Public API (docs/design.md, "Public API"): ``debounced_task``, ``debounced_receiver``,
``trigger_many``, ``TriggerResult`` and ``RunInfo``.
"""

from typing import TYPE_CHECKING, Any

__all__ = [
    "debounced_task",
    "debounced_receiver",
    "trigger_many",
    "TriggerResult",
    "RunInfo",
    "KeyStatus",
]
__version__ = "0.2.0.dev0"

if TYPE_CHECKING:
    from django_debounce.decorators import debounced_receiver, debounced_task, trigger_many
    from django_debounce.state import KeyStatus, RunInfo, TriggerResult


def __getattr__(name: str) -> Any:
    # Lazy so that importing the package does not import Django models before apps are ready.
    if name in ("debounced_task", "debounced_receiver", "trigger_many"):
        from django_debounce import decorators

        return getattr(decorators, name)
    if name in ("TriggerResult", "RunInfo", "KeyStatus"):
        from django_debounce import state

        return getattr(state, name)
    raise AttributeError(name)
