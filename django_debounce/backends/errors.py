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


def reply_kind(exc: BaseException) -> str:
    """The first word of a Redis error reply (``"OOM"``, ``"ERR"``, ...), or ``""``."""
    text = str(exc.args[0]) if getattr(exc, "args", None) else str(exc)
    return text.split(" ", 1)[0].upper() if text else ""


def redis_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (from redis-py) means Redis cannot take the step now: a dropped
    connection, a timeout, or an error reply of ``UNAVAILABLE_REPLIES``; never a script's
    own error."""
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisError, ResponseError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:  # pragma: no cover - redis is optional
        return isinstance(exc, OSError)
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError)):
        return True
    if isinstance(exc, ResponseError):
        return reply_kind(exc) in UNAVAILABLE_REPLIES
    return isinstance(exc, RedisError) and reply_kind(exc) in UNAVAILABLE_REPLIES


def store_unavailable(exc: BaseException) -> bool:
    """``redis_unavailable``, or a database that cannot be reached (``OperationalError``,
    ``InterfaceError``)."""
    return isinstance(exc, (OperationalError, InterfaceError)) or redis_unavailable(exc)
