"""The public decorators: ``debounced_task``, ``debounced_receiver`` (defined in
``receivers``) and ``trigger_many``. Their options are declared once, in
``django_debounce.options.DebounceOptions``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from celery import shared_task
from django.db import models

from django_debounce.options import DebounceOptions, check_not_async, task_base
from django_debounce.receivers import DebouncedReceiverTask, debounced_receiver
from django_debounce.state import TriggerResult
from django_debounce.tasks import MAX_WAIT_KWARG, WAIT_KWARG, DebouncedTask

__all__ = ["debounced_receiver", "debounced_task", "trigger_many"]

F = TypeVar("F", bound=Callable[..., Any])


def debounced_task(func: F | None = None, /, **options: Any) -> Any:
    """Make ``func`` a Celery task whose ``.trigger(...)`` runs it once per burst per key.

    Used bare (``@debounced_task``) or with options (``@debounced_task(wait=5, queue="slow")``).
    ``options`` are this app's, declared by ``DebounceOptions`` (durations in seconds, as
    ``int``/``float`` or ``timedelta``):

    - ``wait``: quiet period; a trailing run starts ``wait`` after the last trigger
      (``DEBOUNCE_DEFAULT_WAIT`` when omitted). ``wait=0`` with no overlap coalesces.
    - ``max_wait``: bound on how long triggers can delay a run (``None``: unbounded), measured
      as lodash's ``maxWait``: from the last run's start while the stream of triggers goes
      on, else from the flight's first trigger; raised to ``wait`` if lower.
    - ``key``: callable with the task's signature returning the key string; default is the
      task name plus the canonical JSON of the bound arguments.
    - ``leading``/``trailing``: edge semantics as lodash debounce. ``leading=True`` runs at
      the first trigger of a burst (when the key's last trigger is ``wait`` or more ago);
      with ``trailing=True`` as well, a trailing run follows only if more triggers came in
      the window; ``trailing=False`` drops triggers inside the window of a leading run
      (counted as ``cancelled``). Throttle: ``leading=True, max_wait=wait``.
      ``leading=False, trailing=False`` is refused (lodash accepts it; it would never run).
    - ``overlap``: allow two runs of one key at once (default ``False``).
    - ``collect``: batch mode: ``trigger(item)`` takes one JSON value and the body is called
      once per flight with the list of distinct items in trigger order; the default key is
      then the task name (``key=`` receives the item). ``collect_limit`` (default 1000)
      caps a run's items; a flight that reaches it runs at once.
    - ``lease``: seconds a run may go without finishing or having its lease extended
      (default: the task's hard ``time_limit`` plus 5 s, else ``DEBOUNCE_LEASE``).
    - ``on_commit``: defer triggers made in a transaction to its commit (``DEBOUNCE_ON_COMMIT``).
    - ``backend``: store of this task's keys (``DEBOUNCE_BACKEND`` when omitted).

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
    debounce, celery_options = DebounceOptions.split_with_routing(options)

    def decorate(fn: F) -> Any:
        check_not_async(fn, "debounced_task")
        _check_reserved(fn)
        base = task_base(celery_options.pop("base", None), DebouncedTask, "debounced_task")
        return shared_task(base=base, **debounce.task_attributes(), **celery_options)(fn)

    if func is not None:
        return decorate(func)
    return decorate


def _check_reserved(fn: Callable[..., Any]) -> None:
    """A body may not name a parameter as a trigger call's own keywords (``debounce_wait``,
    ``debounce_max_wait``): ``trigger()`` takes them for itself."""
    try:
        names = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return
    taken = sorted(names & {WAIT_KWARG, MAX_WAIT_KWARG})
    if taken:
        raise TypeError(
            f"The parameter(s) {', '.join(taken)} of {getattr(fn, '__qualname__', fn)!r} are "
            "reserved: trigger() takes them as this trigger's own wait and max_wait. Rename "
            "them."
        )


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
