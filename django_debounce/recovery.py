"""Recovery (docs/design.md, "State machine": recover) run outside a trigger: by ``debounce_purge``,
when a Celery worker starts (a worker that starts after a crash or a broker restart picks up flights
whose dispatch message was lost), and every ``DEBOUNCE_RECOVERY_INTERVAL`` seconds in each worker,
so a lost message or a lost run is redone even when no trigger of its key comes."""

from __future__ import annotations

import logging
from typing import Any

from django_debounce import conf
from django_debounce.backends import get_backend
from django_debounce.dispatch import publish_quietly
from django_debounce.exceptions import UnknownTask
from django_debounce.tasks import get_debounced_task

logger = logging.getLogger("django_debounce")


def recover() -> int:
    """Redo runs whose lease ran out and re-dispatch flights whose message is overdue by more
    than ``DEBOUNCE_DISPATCH_GRACE`` seconds (or was never published), for every key: the
    stores recover all keys at once and record each message as outstanding, so every message
    they return is published. Only tasks registered as debounced tasks are dispatched.
    Returns how many messages were published."""
    published = 0
    unknown: dict[str, int] = {}
    for name, dispatch in get_backend().recover(grace=conf.seconds_of("DISPATCH_GRACE")):
        try:
            task = get_debounced_task(name)
        except UnknownTask:
            unknown[name] = unknown.get(name, 0) + 1
            continue
        if publish_quietly(task, dispatch):
            published += 1
    if unknown:
        logger.warning(
            "django_debounce: not re-dispatching %d flight(s) of tasks that are not registered "
            "debounced tasks here: %s. Import the modules that define them; for a task that "
            "was removed or renamed, drop its triggers with `manage.py debounce_purge "
            "--older-than 7d --unregistered`.",
            sum(unknown.values()),
            ", ".join(f"{name} ({n})" for name, n in sorted(unknown.items())),
        )
    return published


def registered_names() -> set[str]:
    """Celery names of the debounced tasks registered in this process."""
    from django_debounce.tasks import registered_debounced_tasks

    return {task.name for task in registered_debounced_tasks()}


def cancel_unregistered(keys: Any, *, dry_run: bool = False) -> tuple[int, int, list[str]]:
    """Drop the pending triggers of the keys in ``keys`` (a ``DebounceKey`` queryset) whose
    task is not a registered debounced task here (removed or renamed), through the store
    that holds each key (``DebounceKey.store``); nothing is dispatched. Such keys then turn
    idle and are purged like any other. Returns ``(keys with triggers dropped, triggers
    dropped, task names)``; with ``dry_run`` counts what would be dropped from the rows."""
    registered = registered_names()
    orphans = keys.active().exclude(task_name__in=registered)
    names = sorted(set(orphans.values_list("task_name", flat=True)))
    if dry_run:
        rows = list(orphans.values_list("pending", flat=True))
        return sum(1 for p in rows if p), sum(rows), names
    touched = dropped = 0
    for row in orphans.only("key_hash", "store").iterator():
        n = get_backend(row.store).cancel(row.key_hash)
        touched += 1 if n else 0
        dropped += n
    return touched, dropped, names


def recover_quietly(when: str = "periodically") -> int:
    """``recover()`` that logs instead of raising (it runs in the worker's event loop)."""
    from django.db import close_old_connections

    close_old_connections()
    try:
        count = recover()
    except Exception:
        logger.exception("django_debounce: recovery %s failed", when)
        return 0
    if count:
        logger.warning("django_debounce: re-dispatched %d flights %s", count, when)
    return count


def recover_on_worker_start(sender: Any = None, **kwargs: Any) -> None:
    """Celery ``worker_ready`` hook: run recovery once, then every
    ``DEBOUNCE_RECOVERY_INTERVAL`` seconds on the consumer's timer (``None`` or ``0``: only at
    start). Never stops the worker from starting."""
    recover_quietly("at worker start")
    try:
        interval = conf.seconds(
            conf.get("RECOVERY_INTERVAL"), name="DEBOUNCE_RECOVERY_INTERVAL", allow_none=True
        )
    except Exception as exc:
        logger.error("django_debounce: no periodic recovery: %s", exc)
        return
    timer = getattr(sender, "timer", None)
    if interval and timer is not None:
        timer.call_repeatedly(interval, recover_quietly)
