"""Which errors mean "this store cannot take the step now" (the ``auto`` store falls back to
the database; a worker delivers the message again later), as opposed to a bug (a script
error), which is raised as it is."""

from __future__ import annotations

from django.db import InterfaceError, OperationalError

# Redis error replies that mean the server cannot take a write now: out of memory, a
# read-only replica, a master down or loading its data, a script or module busy, a failed
# snapshot that stops writes, a cluster down or its slots moving, too few replicas, an ACL
# that forbids the command (docs/operations.md, "Redis outages and failover").
UNAVAILABLE_REPLIES = frozenset(
    {
        "OOM",
        "READONLY",
        "MASTERDOWN",
        "LOADING",
        "BUSY",
        "MISCONF",
        "CLUSTERDOWN",
        "TRYAGAIN",
        "NOREPLICAS",
        "NOPERM",
    }
)


# redis-py turns some error replies into exception classes of their own and strips the
# first word from the message ("OOM command not allowed ..." becomes
# ``OutOfMemoryError("command not allowed ...")``): the word each class stands for.
_REPLY_CLASSES = (
    ("OutOfMemoryError", "OOM"),
    ("ReadOnlyError", "READONLY"),
    ("BusyLoadingError", "LOADING"),
    ("NoPermissionError", "NOPERM"),
    ("TryAgainError", "TRYAGAIN"),
    ("MasterDownError", "MASTERDOWN"),
    ("ClusterDownError", "CLUSTERDOWN"),
)


def reply_kind(exc: BaseException) -> str:
    """The first word of a Redis error reply (``"OOM"``, ``"ERR"``, ...), or ``""``; also for
    the error classes of redis-py that strip it (``OutOfMemoryError`` is ``"OOM"``)."""
    try:
        from redis import exceptions
    except ImportError:  # pragma: no cover - redis is optional
        exceptions = None  # type: ignore[assignment]
    if exceptions is not None:
        for name, word in _REPLY_CLASSES:
            cls = getattr(exceptions, name, None)
            if isinstance(cls, type) and isinstance(exc, cls):
                return word
    code = getattr(exc, "status_code", None)
    if isinstance(code, str) and code:
        return code.upper()
    text = str(exc.args[0]) if getattr(exc, "args", None) else str(exc)
    return text.split(" ", 1)[0].upper() if text else ""


def redis_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (from redis-py) means Redis cannot take the step now: a dropped
    connection, a timeout, or an error reply of ``UNAVAILABLE_REPLIES`` (redis-py's
    ``OutOfMemoryError``, ``ReadOnlyError``, ... included); never a script's own error."""
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:  # pragma: no cover - redis is optional
        return isinstance(exc, OSError)
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError)):
        return True
    return isinstance(exc, RedisError) and reply_kind(exc) in UNAVAILABLE_REPLIES


def refused(exc: BaseException) -> bool:
    """Whether Redis answered with an error reply of ``UNAVAILABLE_REPLIES`` instead of
    running the command (it wrote nothing), as opposed to a dropped connection or a timeout,
    which may come after the command ran."""
    return reply_kind(exc) in UNAVAILABLE_REPLIES


def unopened(exc: BaseException) -> frozenset[str]:
    """The key hashes whose durable rows a failed trigger of the Redis store opened although
    Redis refused the script that would have opened their flights (``mark_unopened``)."""
    return frozenset(getattr(exc, "debounce_unopened", ()))


def mark_unopened(exc: BaseException, key_hashes: set[str]) -> None:
    """Say on ``exc`` that Redis refused (``refused``) the scripts of ``key_hashes`` after
    their durable rows were opened (``record.seed``): no flight of theirs is in Redis, so
    the database store that takes the triggers over owes Redis nothing (``_Key.adopt``)."""
    if key_hashes:
        exc.debounce_unopened = frozenset(key_hashes) | unopened(exc)  # type: ignore[attr-defined]


def store_unavailable(exc: BaseException) -> bool:
    """``redis_unavailable``, or a database that cannot be reached (``OperationalError``,
    ``InterfaceError``)."""
    return isinstance(exc, (OperationalError, InterfaceError)) or redis_unavailable(exc)
