"""Dispatch messages: what they carry, how they are published, and what happens when the broker
refuses one (docs/design.md, "Messages").

A dispatch message is a call of the debounced task itself with one reserved keyword argument,
``{"__debounce__": {"k": <key hash>, "s": <seq>, "v": 2}}``: the payload is read from the store
at claim time, and the sequence number fences duplicates (a ``"b"`` of older messages is
ignored). Messages are always JSON. A message waits at most the pump interval in the broker
(its countdown); longer waits happen in the store's due index.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from celery import Task

from django_debounce.state import Dispatch

logger = logging.getLogger("django_debounce")

# The reserved keyword that marks a message as a dispatch message rather than a plain call.
DISPATCH_KWARG = "__debounce__"
VERSION = 2
# Most characters of the readable key that monitoring shows (a longer key: its first 127 and
# "…"); a UUID key such as "catalogue.product:<uuid>" is shown whole.
LABEL = 128
# A key hash: SHA-256 in lower-case hex (keys.key_hash); anything else names no key.
_KEY_HASH = re.compile(r"[0-9a-f]{64}")
RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.1, "interval_max": 0.1}


@dataclass(frozen=True)
class Message:
    """A parsed dispatch message."""

    key_hash: str
    seq: int


def parse_message(message: Any) -> Message | None:
    """The ``__debounce__`` value of a task call as a ``Message``; ``None`` when it is malformed
    (wrong keys or types, a key hash that is not 64 lower-case hex digits, a negative or
    non-integer sequence: logged and dropped by the caller)."""
    if not isinstance(message, dict):
        return None
    k, b = message.get("k"), message.get("b")
    if (
        not isinstance(k, str)
        or not _KEY_HASH.fullmatch(k)
        or (b is not None and b not in ("d", "r"))
    ):
        return None
    if not ({"k", "s", "v"} <= set(message) <= {"k", "s", "b", "n", "v"}):
        return None
    seq = message["s"]
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        return None
    if message["v"] != VERSION:
        return None
    return Message(k, seq)


def is_eager(task: Task) -> bool:
    """True under Celery's ``task_always_eager``, where a trigger never runs the body at once."""
    return bool(task.app.conf.task_always_eager)


def message_of(dispatch: Dispatch) -> dict[str, Any]:
    """The ``__debounce__`` value of ``dispatch``."""
    return {"k": dispatch.key_hash, "s": dispatch.seq, "v": VERSION}


def publish(task: Task, dispatch: Dispatch, **options: Any) -> None:
    """Publish one dispatch message for ``task``, ``countdown`` seconds from now (at most the
    pump interval), with more of Celery's ``apply_async`` ``options``; the caller checks
    ``is_eager``. Raises what ``apply_async`` raises when the broker refuses the message."""
    label = dispatch.label or dispatch.key_hash[:12]  # the readable key, or the hash's start
    if len(label) > LABEL:
        label = label[: LABEL - 1] + "…"
    options.update(
        serializer="json",
        # what Flower and `celery events` show instead of {"__debounce__": {"k": <sha256>...}}
        argsrepr="()",
        kwargsrepr=f"{{'key': {label!r}, 'seq': {dispatch.seq}}}",
        # one quick retry (a dropped connection), not Celery's default three: a refused
        # message is released to the due index, so nothing waits on a broker that is down
        retry_policy=RETRY_POLICY,
    )
    if dispatch.countdown > 0:
        options["countdown"] = dispatch.countdown
    task.apply_async(kwargs={DISPATCH_KWARG: message_of(dispatch)}, **options)


def publish_or_release(task: Task, backend: Any, dispatch: Dispatch) -> bool:
    """Publish ``dispatch`` (the caller checks ``is_eager``); when the broker refuses it, put
    its flight back in the due index (``backend.release``), where a pump publishes it once
    the broker is back: a trigger or a run's bookkeeping never fails because the broker is
    down (I8). Returns whether it went out."""
    try:
        publish(task, dispatch)
        return True
    except Exception as exc:
        logger.warning(
            "django_debounce: could not publish the dispatch message of %s (%s); the flight "
            "waits in the due index until the broker is back",
            task.name,
            exc,
        )
    try:
        backend.release([dispatch])
    except Exception:
        logger.exception(
            "django_debounce: could not release a dispatch of %s; the pump takes it again "
            "after DEBOUNCE_DISPATCH_GRACE",
            task.name,
        )
    return False
