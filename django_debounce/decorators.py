"""The public decorators: ``debounced_task``, ``debounced_receiver`` (defined in
``receivers``) and ``trigger_many``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from celery import shared_task
from django.db import models

from django_debounce.options import DebounceOptions, check_not_async, check_reserved, task_base
from django_debounce.receivers import DebouncedReceiverTask, debounced_receiver
from django_debounce.state import TriggerResult
from django_debounce.tasks import DebouncedTask

__all__ = ["debounced_receiver", "debounced_task", "trigger_many"]

F = TypeVar("F", bound=Callable[..., Any])


def debounced_task(func: F | None = None, /, **options: Any) -> Any:
    """Make ``func`` a Celery task whose ``.trigger(...)`` runs it once per burst per key.

    Used bare (``@debounced_task``) or with options (``@debounced_task(wait=5, queue="slow")``).
    ``options`` are this app's, listed with their defaults in ``DebounceOptions`` (``wait``,
    ``max_wait``, ``key``, ``leading``, ``trailing``, ``overlap``, ``collect``,
    ``collect_limit``, ``lease``, ``on_commit``, ``backend``; durations in seconds, as
    ``int``/``float`` or ``timedelta``).

    Every other keyword is a Celery task option (``name``, ``queue``, ``routing_key``,
    ``time_limit``, ``bind``, ``max_retries``, ...), which dispatch messages, retries and
    follow-up runs all obey. ``base=`` takes a ``celery.Task`` subclass, mixed in after
    ``DebouncedTask`` (its attributes, hooks and methods apply; one that defines
    ``__call__`` or ``run`` is refused, see ``options.task_base``). Failures: when the body
    raises (or calls ``retry()``), the run's triggers go back to pending and run again after
    the task's Celery backoff (``default_retry_delay``, or ``retry_backoff``/
    ``retry_backoff_max``/``retry_jitter``), at most ``max_retries`` times (Celery's default
    3; ``max_retries=0`` never retries); triggers during the backoff join the retry.

    Returns a Celery task (a ``DebouncedTask``, subclass of ``celery.Task``) with
    ``trigger()``, ``atrigger()``, ``status()``, ``flush()`` and ``cancel()``; ``delay()``
    stays a plain Celery call. The body may declare a keyword-only ``debounce`` parameter to
    receive a ``RunInfo``. Raises ``ImproperlyConfigured`` for invalid options (an
    ``expires`` shorter than ``DEBOUNCE_DISPATCH_GRACE`` among them), ``TypeError`` for
    unknown ones (naming the likely one) and for an ``async def`` body.
    """
    debounce, celery_options = DebounceOptions.split(options)

    def decorate(fn: F) -> Any:
        check_not_async(fn, "debounced_task")
        check_reserved(fn)
        base = task_base(celery_options.pop("base", None), DebouncedTask, "debounced_task")
        return shared_task(base=base, **debounce.task_attributes(), **celery_options)(fn)

    return decorate(func) if func is not None else decorate


def trigger_many(task: Any, payloads: Iterable[Any]) -> list[TriggerResult]:
    """Trigger ``task`` once per item of ``payloads`` (for bulk writes, which send no signals).

    For a ``debounced_receiver`` task, items are model instances (or primary keys, then
    ``payloads`` must be a QuerySet). For a ``debounced_task``, an item is a tuple of
    positional arguments, a dict of keyword arguments, or a single positional argument.
    Returns one ``TriggerResult`` per item; triggers of one key merge as usual. The store
    takes them in batches (one pipeline per batch on Redis, a few statements per batch for
    the durable records). Inside ``transaction.atomic()`` they count when it commits.
    Raises ``TypeError`` when ``task`` is not a debounced task or an item does not fit it
    (before anything is counted).
    """
    if not isinstance(task, DebouncedTask):
        raise TypeError(f"trigger_many() needs a debounced task, got {task!r}.")
    resolved = []
    if isinstance(task, DebouncedReceiverTask):
        model = getattr(payloads, "model", None) or task.debounce_sender
        for item in payloads:
            args = (item,) if isinstance(item, models.Model) else (model, item)
            resolved.append(task._resolve(args, {}))
    else:
        for item in payloads:
            if isinstance(item, tuple):
                resolved.append(task._resolve(item, {}))
            elif isinstance(item, dict):
                resolved.append(task._resolve((), item))
            else:
                resolved.append(task._resolve((item,), {}))
    return task.trigger_resolved(resolved)  # type: ignore[no-any-return]
