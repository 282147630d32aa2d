"""The options of ``@debounced_task`` and ``@debounced_receiver`` (``DebounceOptions``) and
of one trigger call (``TRIGGER_OPTIONS``), each declared once: name, default and check."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

from celery import Task
from django.core.exceptions import ImproperlyConfigured

from django_debounce import conf
from django_debounce.state import FlightOptions

DEFAULT_COLLECT_LIMIT = 1000  # items per run of a collecting task

# Options Celery's task decorator accepts besides the attributes of ``celery.Task``: the
# decorator's own, and the routing and execution options Celery reads from a task's
# attributes when it publishes (``celery.app.task.extract_exec_options``).
CELERY_DECORATOR_OPTIONS = frozenset(
    {
        "queue",
        "routing_key",
        "exchange",
        "delivery_mode",
        "compression",
        "immediate",
        "mandatory",
        "base",
        "shared",
        "filter",
        "lazy",
        "pydantic",
        "pydantic_strict",
        "pydantic_context",
        "pydantic_dump_kwargs",
        "autoretry_for",
        "dont_autoretry_for",
        "retry_kwargs",
        "retry_backoff",
        "retry_backoff_max",
        "retry_jitter",
    }
)


# The Celery options that route a task's messages. Celery reads them from task attributes but
# deprecates that (removed in Celery 6), so the decorators keep them apart (``split``) and
# ``DebouncedTask.apply_async`` gives them to every publish: dispatch messages, retries and
# plain calls all go where the decorator routes the task.
ROUTING_OPTIONS = ("queue", "routing_key", "exchange", "exchange_type", "delivery_mode", "priority")


@dataclasses.dataclass(frozen=True)
class DebounceOptions:
    """This app's options of both decorators (durations in seconds, ``int``/``float`` or
    ``timedelta``; stored as ``float``).

    - ``wait``: quiet period; a trailing run starts ``wait`` after the last trigger
      (``None``: ``DEBOUNCE_DEFAULT_WAIT``, read when used). ``wait=0`` with no overlap
      coalesces.
    - ``max_wait``: bound on how long triggers can delay a run (``None``: unbounded), measured
      as lodash's ``maxWait``: from the last run's start while the stream of triggers goes
      on, else from the flight's first trigger; raised to ``wait`` if lower.
    - ``key``: callable returning the key string (a task: called with the task's arguments,
      default the task name plus the canonical JSON of the bound arguments; a receiver:
      with the payload's fields; collecting: with the item).
    - ``leading``/``trailing``: edge semantics as lodash debounce. ``leading=True`` runs at
      the first trigger of a burst (when the key's last trigger is ``wait`` or more ago);
      with ``trailing=True`` as well, a trailing run follows only if more triggers came in
      the window; ``trailing=False`` drops triggers inside the window of a leading run
      (counted as ``cancelled``). Throttle: ``leading=True, max_wait=wait``.
      ``leading=False, trailing=False`` is refused (lodash accepts it; it would never run).
    - ``overlap``: allow two runs of one key at once (default ``False``).
    - ``collect``: batch mode: ``trigger(item)`` takes one JSON value and the body is called
      once per flight with the list of distinct items in trigger order; the default key is
      then the task name. ``collect_limit`` (default 1000) caps a run's items; a flight that
      reaches it runs at once.
    - ``lease``: seconds a run may go without finishing or having its lease extended
      (``None``: the task's hard ``time_limit`` plus 5 s, else ``DEBOUNCE_LEASE``).
    - ``on_commit``: defer triggers made in a transaction to its commit (``None``:
      ``DEBOUNCE_ON_COMMIT``).
    - ``backend``: the store of the task's keys (``None``: ``DEBOUNCE_BACKEND``).

    Raises ``ImproperlyConfigured`` naming the fix for a value that cannot work.
    """

    wait: float | None = None
    max_wait: float | None = None
    key: Callable[..., str] | None = None
    leading: bool = False
    trailing: bool = True
    overlap: bool = False
    collect: bool = False
    collect_limit: int | None = None
    lease: float | None = None
    on_commit: bool | None = None
    backend: str | None = None

    NAMES: ClassVar[frozenset[str]]

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise in place once
        set_(self, "wait", conf.seconds(self.wait, name="wait", allow_none=True))
        set_(self, "max_wait", conf.seconds(self.max_wait, name="max_wait", allow_none=True))
        if not self.leading and not self.trailing:
            raise ImproperlyConfigured(
                "leading=False with trailing=False would never run the task (as lodash "
                "debounce); set leading=True for a run at the start of each burst, or keep "
                "trailing=True."
            )
        if self.collect_limit is not None and not self.collect:
            raise ImproperlyConfigured(
                "collect_limit= applies only to a collecting task: add collect=True, or drop "
                "collect_limit=."
            )
        limit = DEFAULT_COLLECT_LIMIT if self.collect_limit is None else self.collect_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ImproperlyConfigured(
                f"collect_limit= must be a positive int (items per run), got {limit!r}."
            )
        set_(self, "collect_limit", limit)
        set_(self, "lease", conf.seconds(self.lease, name="lease", allow_none=True, positive=True))
        if self.key is not None and not callable(self.key):
            raise ImproperlyConfigured(
                f"key= must be a callable returning a str, got {self.key!r}."
            )
        for name in ("leading", "trailing", "overlap", "collect"):
            set_(self, name, bool(getattr(self, name)))

    @classmethod
    def split(
        cls, options: dict[str, Any], *, extra: tuple[str, ...] = ()
    ) -> tuple[DebounceOptions, dict[str, Any]]:
        """Split a decorator's keywords into this app's options (validated) and Celery task
        options (checked: a misspelt name is a ``TypeError`` naming the likely one, an
        ``expires`` shorter than ``DEBOUNCE_DISPATCH_GRACE`` is refused), the routing ones
        (``ROUTING_OPTIONS``) moved into the task attribute ``debounce_route``. ``extra`` names
        the decorator's own other keywords, for the hint."""
        ours = {name: options[name] for name in cls.NAMES if name in options}
        celery = {name: value for name, value in options.items() if name not in cls.NAMES}
        check_celery_options(celery, known=(*cls.NAMES, *extra))
        celery["debounce_route"] = {n: celery.pop(n) for n in ROUTING_OPTIONS if n in celery}
        return cls(**ours), celery

    def task_attributes(self) -> dict[str, Any]:
        """The ``DebouncedTask`` class attributes these options set (``debounce_<name>``)."""
        out = {f"debounce_{f.name}": getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.key is not None:
            out["debounce_key"] = staticmethod(self.key)
        return out


DebounceOptions.NAMES = frozenset(f.name for f in dataclasses.fields(DebounceOptions))


def call_seconds(value: Any, name: str) -> float:
    """A duration given at a trigger call, in seconds. Raises ``TypeError``/``ValueError``
    naming the keyword and the accepted forms."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}= takes seconds (int or float) or a timedelta, got {value!r}.")
    if not (0 <= value <= conf.MAX_SECONDS):
        raise ValueError(
            f"{name}= must be from 0 to {conf.MAX_SECONDS:.0f} seconds (a year), got {value!r}."
        )
    return float(value)


# The keywords of a trigger call that are the call's own, not the task's arguments (a task
# body may not name a parameter so): keyword -> (the ``FlightOptions`` field it sets for this
# trigger, the check that parses its value). A new per-trigger option is a row here.
TRIGGER_OPTIONS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "debounce_wait": ("wait", call_seconds),
    "debounce_max_wait": ("max_wait", call_seconds),
}


def trigger_options(
    kwargs: dict[str, Any], task_options: Callable[[], FlightOptions]
) -> FlightOptions | None:
    """Take the ``TRIGGER_OPTIONS`` keywords out of a trigger call's ``kwargs``: the task's
    options (``task_options()``) with them applied, ``max_wait`` never below ``wait`` (as
    lodash's ``maxWait``); ``None`` when the call gives none. Raises ``TypeError`` /
    ``ValueError`` naming the keyword."""
    given = {}
    for keyword, (field, parse) in TRIGGER_OPTIONS.items():
        value = kwargs.pop(keyword, None)
        if value is not None:
            given[field] = parse(value, keyword)
    if not given:
        return None
    options = dataclasses.replace(task_options(), **given)
    if options.max_wait is not None and options.max_wait < options.wait:
        options = dataclasses.replace(options, max_wait=options.wait)
    return options


def check_reserved(fn: Callable[..., Any]) -> None:
    """A body may not name a parameter as a trigger call's own keywords
    (``TRIGGER_OPTIONS``): ``trigger()`` takes them for itself. Raises ``TypeError``."""
    try:
        names = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return
    taken = sorted(names & TRIGGER_OPTIONS.keys())
    if taken:
        raise TypeError(
            f"The parameter(s) {', '.join(taken)} of {getattr(fn, '__qualname__', fn)!r} are "
            "reserved: trigger() takes them as this trigger's own options. Rename them."
        )


def check_celery_options(options: dict[str, Any], *, known: tuple[str, ...] = ()) -> None:
    """Refuse a keyword that is neither a Celery task option nor one of ``known`` (a misspelt
    option must not silently become a Celery task attribute), and an ``expires`` that
    contradicts debouncing. Raises ``TypeError`` / ``ImproperlyConfigured``."""
    for name in options:
        if name in CELERY_DECORATOR_OPTIONS or hasattr(Task, name):
            continue
        candidates = [
            *known,
            *CELERY_DECORATOR_OPTIONS,
            *(a for a in dir(Task) if not a.startswith("_")),
        ]
        close = difflib.get_close_matches(name, candidates, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise TypeError(
            f"Unknown option {name!r}: it is neither a django-debounce option nor a Celery "
            f"task option.{hint}"
        )
    if len(str(options.get("name", ""))) > 255:  # DebounceKey.task_name
        raise ImproperlyConfigured(
            "name= of a debounced task has more than 255 characters, the most a store keeps."
        )
    expires = options.get("expires")
    if expires is None:
        return
    if not isinstance(expires, (int, float)) or isinstance(expires, bool):
        raise ImproperlyConfigured(
            f"expires= of a debounced task must be a number of seconds, got {expires!r}: an "
            "absolute time would make every dispatch message after it expire unrun."
        )
    grace = conf.seconds_of("DISPATCH_GRACE")
    if expires < grace:
        raise ImproperlyConfigured(
            f"expires={expires!r} is shorter than DEBOUNCE_DISPATCH_GRACE ({grace:g} s), the "
            "time a dispatch message may wait in its queue before it is published again: "
            "messages that are only slow would expire and their flights run a grace late. "
            f"Give expires of at least {grace:g} seconds, or leave it out."
        )


def check_not_async(fn: Callable[..., Any], decorator: str) -> None:
    """Celery calls a task body synchronously: an ``async def`` body would return a coroutine
    that is never awaited, and the run would count as a success. Raises ``TypeError``."""
    if inspect.iscoroutinefunction(fn):
        raise TypeError(
            f"{decorator} cannot decorate the coroutine function "
            f"{getattr(fn, '__qualname__', fn)!r}: Celery runs task bodies synchronously, so "
            "it would never be awaited. Write a plain def (inside, asgiref.sync.async_to_sync "
            "runs async code)."
        )


# What a debounced run does not go through: the base's own ``__call__`` would be skipped by
# dispatch messages (the run machinery calls the body), and ``run`` is the body itself.
_NOT_MIXABLE = ("__call__", "run")


def task_base(base: Any, debounced: type[Task], decorator: str) -> type[Task]:
    """The task class for ``base=`` given to ``decorator``: ``debounced`` itself, a subclass
    of it as given, or a plain ``celery.Task`` subclass mixed in after ``debounced`` (so a
    debounced run keeps this app's machinery and the base adds its attributes, hooks such as
    ``on_failure``/``after_return``, and methods). Raises ``ImproperlyConfigured`` for
    anything else, and for a base that defines ``__call__`` or ``run``, which debounced runs
    would skip."""
    if base is None or base is debounced:
        return debounced
    if not (isinstance(base, type) and issubclass(base, Task)):
        raise ImproperlyConfigured(
            f"base= of {decorator} must be a celery.Task subclass, got {base!r}."
        )
    if issubclass(base, debounced):
        return base
    for klass in base.__mro__:
        if klass is Task:
            break
        taken = [name for name in _NOT_MIXABLE if name in vars(klass)]
        if taken:
            raise ImproperlyConfigured(
                f"base={base.__qualname__} of {decorator} defines {', '.join(taken)} (in "
                f"{klass.__qualname__}), which a debounced run does not go through: the "
                "run calls the body itself. Move that code into the body, or into the "
                "base's before_start/after_return hooks, or subclass "
                f"django_debounce.tasks.{debounced.__name__}."
            )
    name = f"{debounced.__name__}{base.__name__}"
    return type(name, (debounced, base), {"__module__": base.__module__})
