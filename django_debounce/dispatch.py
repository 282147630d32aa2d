"""Publishing dispatch messages: relative countdowns, fenced by a sequence number, JSON only."""

from __future__ import annotations

import logging

from celery import Task

from django_debounce.exceptions import PublishError
from django_debounce.state import Dispatch

logger = logging.getLogger("django_debounce")

# The reserved keyword that marks a message as a dispatch message rather than a plain call.
DISPATCH_KWARG = "__debounce__"


def is_eager(task: Task) -> bool:
    """True under Celery's ``task_always_eager``, where a trigger never runs the body at once."""
    return bool(task.app.conf.task_always_eager)


def publish(task: Task, dispatch: Dispatch) -> None:
    """Publish one dispatch message for ``task``: ``countdown`` seconds from now, fenced by ``seq``.

    Under ``task_always_eager`` nothing is published: the flight stays pending until
    ``django_debounce.testing.run_due()`` or a flush (docs/design.md, "Messages").
    Raises ``PublishError`` when the broker refuses the message.
    """
    if is_eager(task):
        return
    try:
        if dispatch.kind == "watch":
            message = {"k": dispatch.key_hash, "w": dispatch.seq, "b": dispatch.store}
        else:
            message = {"k": dispatch.key_hash, "s": dispatch.seq, "b": dispatch.store}
        task.apply_async(
            kwargs={DISPATCH_KWARG: message},
            countdown=dispatch.countdown,
            serializer="json",
        )
    except Exception as exc:
        raise PublishError(
            f"Could not publish the dispatch message of {task.name} ({exc}). The trigger was "
            "not counted; check the Celery broker and trigger again."
        ) from exc


def publish_quietly(task: Task, dispatch: Dispatch) -> bool:
    """Publish where the caller cannot undo the state change (worker side).

    A failure is logged; the flight is re-dispatched by recovery after
    ``DEBOUNCE_DISPATCH_GRACE`` seconds. Returns whether the publish succeeded.
    """
    try:
        publish(task, dispatch)
    except PublishError:
        logger.exception(
            "django_debounce: publish failed for %s; recovery will re-dispatch", task.name
        )
        return False
    return True
