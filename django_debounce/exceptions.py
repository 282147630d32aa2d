"""Errors that users of django-debounce can hit; each message says what to do."""

from __future__ import annotations


class DebounceError(Exception):
    """Base class of every django-debounce error."""


class StoreUnavailable(DebounceError):
    """A step could not be taken safely now (the Redis store cannot seal the counter of a
    flight it would drop); nothing was changed, and the same call can be made again later."""


class UnknownTask(DebounceError):
    """A task name read from the database is not a registered debounced task.

    Import the module that defines the task in the worker and the web process
    (``app.autodiscover_tasks()``), or purge the stale key with ``debounce_purge``.
    """


class UnsupportedArgument(DebounceError, TypeError):
    """A trigger's argument cannot be stored: it is neither JSON nor one of the types of
    Django's ``DjangoJSONEncoder`` (``datetime``, ``date``, ``time``, ``timedelta``,
    ``Decimal``, ``UUID``).

    Raised by ``trigger()`` (and ``trigger_many()``, ``flush()``, ``cancel()``, ``status()``)
    before anything is counted or deferred to a transaction's commit. Pass an identifier
    (a primary key) instead of an object; it is a ``TypeError`` too.
    """


class IntegerTooLong(DebounceError, ValueError):
    """A trigger's argument holds an integer with more digits than Python turns into text
    (``sys.get_int_max_str_digits()``, 4300 by default), so its JSON payload cannot be built.

    Raised by ``trigger()`` (and ``trigger_many()``, ``flush()``, ``cancel()``, ``status()``)
    before anything is counted or deferred to a transaction's commit. Pass the number as a
    string and convert it in the body, or raise the limit (``sys.set_int_max_str_digits()``
    or ``PYTHONINTMAXSTRDIGITS``) in every process that triggers or runs the task; it is a
    ``ValueError`` too.
    """
