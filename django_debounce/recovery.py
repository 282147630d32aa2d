"""Recovery (DESIGN.md section 4, step 5) run outside a trigger: by ``debounce_purge`` and
when a Celery worker starts (a worker that starts after a crash or a broker restart picks up
flights whose dispatch message was lost)."""

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
    for name, dispatch in get_backend().recover(grace=float(conf.get("DISPATCH_GRACE"))):
        try:
            task = get_debounced_task(name)
        except UnknownTask as exc:
            logger.warning("django_debounce: not re-dispatching a flight: %s", exc)
            continue
        if publish_quietly(task, dispatch):
            published += 1
    return published


def recover_on_worker_start(sender: Any = None, **kwargs: Any) -> None:
    """Celery ``worker_ready`` hook: run recovery once; never stops the worker from starting."""
    try:
        count = recover()
    except Exception:
        logger.exception("django_debounce: recovery at worker start failed")
        return
    if count:
        logger.warning("django_debounce: re-dispatched %d flights at worker start", count)
