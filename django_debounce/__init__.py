"""django-debounce: run slow Celery work once per burst of Django model saves.

Public API (docs/design.md, "Public API"): ``debounced_task``, ``debounced_receiver``,
``trigger_many``, ``TriggerResult`` and ``RunInfo``.
"""

from typing import TYPE_CHECKING, Any

from django_debounce.state import KeyStatus, RunInfo, TriggerResult

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


def __getattr__(name: str) -> Any:
    # Lazy (PEP 562): Django imports this package to find its AppConfig while the app
    # registry is populated; that import stays free of Celery, the stores and the models
    # (``state`` above imports nothing but the standard library).
    if name in ("debounced_task", "debounced_receiver", "trigger_many"):
        from django_debounce import decorators

        return getattr(decorators, name)
    raise AttributeError(name)
