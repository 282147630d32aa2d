"""The Celery task class: trigger -> fire -> claim -> run body -> finish, as the stores
(``backends/``) decide."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from functools import cached_property, partial
from typing import Any, ClassVar

from asgiref.sync import sync_to_async
from celery import Task, signature
from celery.exceptions import Retry
from celery.utils.time import get_exponential_backoff_interval
from django.db import (
    DEFAULT_DB_ALIAS,
    InterfaceError,
    OperationalError,
    connections,
    router,
    transaction,
)
from django.utils.asyncio import async_unsafe

from django_debounce import argtypes, conf, dbtime, observe, runtable
from django_debounce.backends import get_backend
from django_debounce.backends.base import BaseBackend
from django_debounce.dispatch import (
    DISPATCH_KWARG,
    is_eager,
    parse_message,
    publish_or_release,
)
from django_debounce.keys import (
    RESERVED_PARAMETER,
    PayloadBinder,
    check_size,
    check_text,
    dumps,
    key_hash,
)
from django_debounce.options import DEFAULT_COLLECT_LIMIT, trigger_options
from django_debounce.state import (
    Claim,
    Dispatch,
    Finish,
    FireAction,
    FlightOptions,
    KeyStatus,
    RunInfo,
    TriggerResult,
)

logger = logging.getLogger("django_debounce")

# Errors that mean "the database is unreachable right now", not "the rules said no" (a
# Redis failure never reaches the flow: the Redis store takes the row path instead).
STORE_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)
STORE_RETRY_DELAY = 1.0
STORE_RETRIES = 600
# Seconds a lease derived from a task's hard time limit adds to it: the run is killed at the
# limit, and counted lost this much later (claim-to-start latency, clock drift).
LEASE_MARGIN = 5.0


class _RetryRequested(Retry):
    """Raised by ``DebouncedTask.retry()`` inside a debounced run: the flow layer, not Celery,
    publishes the retry (as the flight's own dispatch message)."""

    def __init__(self, exc: BaseException | None, countdown: float | None, max_retries: Any):
        super().__init__(message=None, exc=exc, when=countdown)
        self.countdown = countdown
        self.max_retries = max_retries


class DebouncedTask(Task):
    """A Celery task whose ``trigger()`` is debounced per key (docs/design.md, "Public API" and
    "State machine").

    ``delay()``/``apply_async()`` stay plain Celery calls. Dispatch messages carry only the
    key hash and a sequence number; the payload is read from the store at claim time.
    """

    # How the registry (registry.py) knows a debounced task without importing this module.
    __debounced__: ClassVar[bool] = True
    typing = False  # dispatch messages carry a reserved keyword the body does not declare

    debounce_wait: float | None = None
    debounce_max_wait: float | None = None
    debounce_key: Callable[..., str] | None = None
    debounce_overlap: bool = False
    debounce_on_commit: bool | None = None
    debounce_lease: float | None = None
    debounce_backend: str | None = None
    debounce_leading: bool = False
    debounce_trailing: bool = True
    debounce_collect: bool = False
    debounce_collect_limit: int = DEFAULT_COLLECT_LIMIT
    # The decorator's routing options (queue=, routing_key=, ...), given to every publish
    # (options.ROUTING_OPTIONS: Celery 5.5+ deprecates them as task attributes).
    debounce_route: ClassVar[dict[str, Any]] = {}

    # -- configuration read when used ----------------------------------------------------

    @property
    def wait(self) -> float:
        """Quiet period in seconds (``DEBOUNCE_DEFAULT_WAIT`` when the decorator gave none)."""
        if self.debounce_wait is not None:
            return self.debounce_wait
        return conf.seconds_of("DEFAULT_WAIT")

    @property
    def lease(self) -> float:
        """Seconds a claimed run may go without finishing or heartbeating: ``lease=`` of the
        decorator; else the task's hard time limit (``time_limit``, or Celery's
        ``task_time_limit``) plus ``LEASE_MARGIN``, since a run past it has been killed;
        else ``DEBOUNCE_LEASE``."""
        if self.debounce_lease is not None:
            return self.debounce_lease
        limit = self.time_limit or self.app.conf.task_time_limit
        if limit:
            return float(limit) + LEASE_MARGIN
        return conf.seconds_of("LEASE")

    @property
    def collect_limit(self) -> int | None:
        """Most items one run of a collecting task receives; ``None`` when not collecting."""
        return self.debounce_collect_limit if self.debounce_collect else None

    def flight_options(self) -> FlightOptions:
        """The task's configuration as the stores need it (read when used, so
        ``override_settings`` of ``DEBOUNCE_DEFAULT_WAIT`` and ``DEBOUNCE_LEASE`` applies).
        ``max_wait`` is never below ``wait``, as lodash's ``maxWait``. Kept until a
        ``DEBOUNCE_`` setting or the task's ``time_limit`` changes."""
        cached = self.__dict__.get("_flight_options_cache")
        if cached is not None and cached[0] == (conf.generation, self.time_limit):
            return cached[1]  # type: ignore[no-any-return]
        wait = self.wait
        max_wait = self.debounce_max_wait
        if max_wait is not None and max_wait < wait:
            max_wait = wait
        options = FlightOptions(
            wait=wait,
            max_wait=max_wait,
            leading=self.debounce_leading,
            trailing=self.debounce_trailing,
            overlap=self.debounce_overlap,
            collect_limit=self.collect_limit,
            collect_bytes=int(conf.get("MAX_BATCH_PAYLOAD")) if self.debounce_collect else None,
            lease=self.lease,
        )
        self.__dict__["_flight_options_cache"] = ((conf.generation, self.time_limit), options)
        return options

    def get_backend(self) -> BaseBackend:
        """The store of this task's keys (``backend=`` of the decorator or ``DEBOUNCE_BACKEND``)."""
        return get_backend(self.debounce_backend)

    @cached_property
    def _binder(self) -> PayloadBinder:
        return PayloadBinder(self.run)

    @cached_property
    def _wants_runinfo(self) -> bool:
        return RESERVED_PARAMETER in inspect.signature(self.run).parameters

    # -- keys and payloads ----------------------------------------------------------------

    def resolve(self, args: tuple, kwargs: dict) -> tuple[str, Any]:
        """Map trigger arguments to ``(readable key, JSON payload)``.

        Raises ``TypeError`` when the arguments do not fit the task's signature, when the
        payload is not JSON-serialisable, or when ``key=`` does not return a string.
        """
        return self._resolve(args, kwargs)[:2]

    def _resolve(self, args: tuple, kwargs: dict) -> tuple[str, Any, str]:
        """``resolve`` plus the payload's canonical JSON, encoded once per trigger."""
        if self.debounce_collect:
            return self._resolve_item(args, kwargs)
        try:
            payload = self._binder(args, kwargs)
        except TypeError as exc:
            raise TypeError(
                f"{self.name} (trigger, status, flush, cancel) takes the arguments of the "
                f"task body {self._binder.sig}: {exc}"
            ) from None
        encoded = dumps(payload)
        check_size(encoded, self.name)
        # stored: the arguments alone when there are no keyword arguments (a lean Redis hash)
        stored = encoded[8:-13] if encoded.endswith(',"kwargs":{}}') else encoded
        if self.debounce_key is None:
            return f"{self.name}:{encoded}", payload, stored
        try:
            key = self.debounce_key(*payload["args"], **payload["kwargs"])
        except TypeError as exc:
            raise TypeError(
                f"key= of {self.name} could not be called with the task's arguments ({exc}); "
                f"it must accept the task's signature {self._binder.sig}."
            ) from None
        return self._checked_key(key), payload, stored

    def _resolve_item(self, args: tuple, kwargs: dict) -> tuple[str, Any, str]:
        """Collect mode: ``trigger(item)`` takes one JSON value; the key is the task name, or
        ``key(item)``."""
        if len(args) != 1 or kwargs:
            raise TypeError(
                f"{self.name} collects items (collect=True): trigger(), flush() and cancel() "
                f"take exactly one JSON value (flush() and cancel() none with the default "
                f"key), got args={args!r} kwargs={kwargs!r}."
            )
        item = args[0]
        encoded = dumps(item)
        check_size(encoded, self.name)
        if self.debounce_key is None:
            return self.name, item, encoded
        return self._checked_key(self.debounce_key(item)), item, encoded

    def _checked_key(self, key: Any) -> str:
        """``key=``'s answer, refused unless a str a store can keep (``TypeError``,
        ``ValueError``)."""
        if not isinstance(key, str):
            raise TypeError(
                f"key= of {self.name} must return a str, got {type(key).__name__}: {key!r}."
            )
        check_text(key, "key")
        return key

    def call_arguments(self, payload: Any) -> tuple[list[Any], dict[str, Any]]:
        """Turn a stored payload back into the body's positional and keyword arguments
        (collect mode: the list of items is the one positional argument), typed values
        (``datetime``, ``Decimal``, ``UUID``, ...) decoded as Celery's JSON would decode them."""
        if self.debounce_collect:
            return [argtypes.decode(list(payload or []))], {}
        if isinstance(payload, list):  # stored as the arguments alone (no keyword arguments)
            return argtypes.decode(payload), {}
        payload = payload or {"args": [], "kwargs": {}}
        return argtypes.decode(list(payload["args"])), argtypes.decode(dict(payload["kwargs"]))

    def key_of_payload(self, payload: Any) -> str:
        """The readable key of a stored payload (a claim carries no key when Redis kept only
        a short one): the task name and canonical arguments, or ``key=`` called with them;
        in collect mode (``payload`` is the list of items) the key of the first item."""
        if self.debounce_collect:
            items = list(payload or [])
            return self._resolve_item((argtypes.decode(items[0]),), {})[0] if items else self.name
        args, kwargs = self.call_arguments(payload)
        return self._resolve(tuple(args), kwargs)[0]

    # -- the public face ------------------------------------------------------------------

    @async_unsafe(
        "trigger() was called from async code (a running event loop): use "
        "`await task.atrigger(...)` there, or sync_to_async(task.trigger)."
    )
    def trigger(self, *args: Any, **kwargs: Any) -> TriggerResult:
        """Count one trigger for the key of these arguments; the body runs later, once per burst.

        Arguments are those of the task body and must be JSON-serialisable. Two keywords are
        this call's own: ``debounce_wait`` and ``debounce_max_wait`` (seconds, or
        ``timedelta``) override the task's ``wait`` and ``max_wait`` for this trigger (its
        flight is due ``wait`` after its last trigger, bounded by the smallest ``anchor +
        max_wait`` among its triggers). Inside ``transaction.atomic()`` the trigger counts
        only when the transaction commits (``on_commit=True``, the default); the result then
        has ``deferred=True``.

        Returns a ``TriggerResult``. Raises ``TypeError`` for arguments that do not fit the
        signature or are not JSON. A trigger never fails because the broker is down: its
        flight waits in the store's due index until a pump publishes it (invariant I8); it
        raises only when no store can record it.
        """
        options = trigger_options(kwargs, self.flight_options)
        key, payload, encoded = self._resolve(args, kwargs)
        return self.trigger_payload(
            key, payload, using=self.alias_of(payload), payload_json=encoded, options=options
        )

    async def atrigger(self, *args: Any, **kwargs: Any) -> TriggerResult:
        """``trigger()`` for async code (an ``async def`` view, an ASGI app), as Django's
        ``asave()`` is to ``save()``: the trigger runs in a thread (``sync_to_async``, thread
        sensitive, so a transaction of the request's thread defers it as ``trigger()``
        would). Same arguments, result and errors as ``trigger()``."""
        return await sync_to_async(self.trigger, thread_sensitive=True)(*args, **kwargs)

    @async_unsafe(
        "status() was called from async code (a running event loop): use "
        "`await task.astatus(...)` there, or sync_to_async(task.status)."
    )
    def status(self, *args: Any, **kwargs: Any) -> KeyStatus | None:
        """The key of these arguments as its store holds it now (pending triggers, due time,
        live run, last run and outcome, totals), without triggering it; ``None`` when the key
        is unknown (never triggered, or purged). Arguments as ``trigger()``'s. Live values
        come from Redis for keys the Redis store holds."""
        # Here, not at the top: a module that declares a @debounced_task may be imported
        # before Django's app registry is ready, and this module imports no model.
        from django_debounce.models import DebounceKey

        key = self._key_of(args, kwargs)
        hashed = key_hash(self.name, key)
        values = self.get_backend().live_rows([hashed]).get(hashed)
        row = (
            DebounceKey.objects.using(router.db_for_read(DebounceKey))
            .filter(key_hash=hashed)
            .values(
                "key", "state", "pending", "flight_id", "due_at", "running_until",
                "last_run_at", "last_outcome", "triggers", "runs", "merged", "cancelled",
            )
            .first()
        )  # fmt: skip
        if values is None and row is None:
            return None
        merged = {**(row or {}), **(values or {})}
        lease = merged.get("running_until")
        counts = ("pending", "flight_id", "triggers", "runs", "merged", "cancelled")
        return KeyStatus(
            key=(row or {}).get("key") or key,
            state=str(merged.get("state") or "idle"),
            due_at=merged.get("due_at") if merged.get("pending") else None,
            running=lease is not None,
            lease_until=lease,
            last_run_at=merged.get("last_run_at"),
            last_outcome=str(merged.get("last_outcome") or ""),
            **{name: int(merged.get(name) or 0) for name in counts},
        )

    async def astatus(self, *args: Any, **kwargs: Any) -> KeyStatus | None:
        """``status()`` for async code (runs in a thread, as ``atrigger()``)."""
        return await sync_to_async(self.status, thread_sensitive=True)(*args, **kwargs)

    def trigger_s(self, *args: Any, **kwargs: Any) -> Any:
        """A Celery signature that triggers this task with these arguments when it runs: for
        a beat schedule, ``send_task``, a ``chain`` or a ``group``, which would otherwise make
        plain, undebounced runs. It calls the registered task ``django_debounce.trigger``
        (which triggers only registered debounced tasks, by name), and is immutable (a chain
        does not pass it the previous result)."""
        return signature(
            "django_debounce.trigger",
            args=(self.name, list(args), dict(kwargs)),
            immutable=True,
            app=self.app,
        )

    def alias_of(self, payload: Any) -> str | None:
        """The database whose transaction defers a trigger with ``payload`` (``None``: see
        ``deferring_alias``). A receiver's is the one its row's model writes to."""
        return None

    def trigger_payload(
        self,
        key: str,
        payload: Any,
        *,
        using: str | None = None,
        payload_json: str,
        options: FlightOptions | None = None,
    ) -> TriggerResult:
        """Count one trigger for an already resolved ``key``, JSON ``payload`` and its stored
        JSON ``payload_json``; ``using``: the database whose transaction defers it (``None``:
        see ``deferring_alias``)."""
        resolved = [(key, payload, payload_json)]
        held = self._held(resolved, using, options)
        if held is not None:
            return held[0]
        backend = self.get_backend()
        ((key, payload, payload_json),) = self.before_send(resolved)
        result, dispatch = backend.trigger(
            task_name=self.name,
            key=key,
            key_hash=key_hash(self.name, key),
            payload_json=payload_json,
            options=options or self.flight_options(),
        )
        result = self._published(backend, result, dispatch)
        observe.triggered(self, result)
        return result

    def _held(
        self, resolved: list[tuple[str, Any, str]], using: str | None, options: FlightOptions | None
    ) -> list[TriggerResult] | None:
        """The results of triggers that do not count now: none counts with
        ``DEBOUNCE_ENABLED`` off; with ``on_commit``, all wait for the commit of
        ``deferring_alias(using)``'s open transaction. ``None``: they count now."""
        if not conf.get("ENABLED"):
            return [TriggerResult(key, None, None, None, scheduled=False) for key, _, _ in resolved]
        on_commit = self.debounce_on_commit
        if on_commit is None:
            on_commit = bool(conf.get("ON_COMMIT"))
        alias = deferring_alias(using) if on_commit else None
        if alias is None:
            return None
        _defer(alias, self, resolved, options)
        return [
            TriggerResult(key, None, None, None, scheduled=False, deferred=True)
            for key, _, _ in resolved
        ]

    def _published(
        self, backend: BaseBackend, result: TriggerResult, dispatch: Dispatch | None
    ) -> TriggerResult:
        """``result`` after publishing ``dispatch``, the message of a flight due within the
        pump interval: ``scheduled=False, publish_failed=True`` when the broker refused it
        (the flight is back in the due index for a pump); ``scheduled=False`` under
        ``task_always_eager``, which publishes nothing (the flight waits for ``run_due``)."""
        if dispatch is None:
            return result
        eager = is_eager(self)
        if not eager and publish_or_release(self, backend, dispatch):
            return result
        return dataclasses.replace(result, scheduled=False, publish_failed=not eager)

    def before_send(self, resolved: list[tuple[str, Any, str]]) -> list[tuple[str, Any, str]]:
        """The triggers ``(key, payload, stored JSON)`` as they go to the store, in order (a
        receiver's raw saves, see ``DebouncedReceiverTask.before_send``)."""
        return resolved

    def trigger_resolved(
        self, resolved: list[tuple[str, Any, str]], *, using: str | None = None
    ) -> list[TriggerResult]:
        """Count the triggers ``(key, payload, stored JSON)`` of ``resolved`` in batches (the
        ``trigger_many`` path); deferred to the commit of ``using``'s transaction when one
        is open, as ``trigger`` is."""
        if using is None and resolved:
            using = self.alias_of(resolved[0][1])
        held = self._held(resolved, using, None)
        return self._trigger_batch(resolved) if held is None else held

    BATCH = 1000

    def _trigger_batch(
        self, resolved: list[tuple[str, Any, str]], options: FlightOptions | None = None
    ) -> list[TriggerResult]:
        backend = self.get_backend()
        options = options or self.flight_options()
        resolved = self.before_send(resolved)
        out: list[TriggerResult] = []
        for start in range(0, len(resolved), self.BATCH):
            chunk = resolved[start : start + self.BATCH]
            items = [(key, key_hash(self.name, key), stored) for key, _, stored in chunk]
            for result, dispatch in backend.trigger_many(
                task_name=self.name, items=items, options=options
            ):
                result = self._published(backend, result, dispatch)
                observe.triggered(self, result)
                out.append(result)
        return out

    def flush(self, *args: Any, **kwargs: Any) -> bool:
        """Run the pending flight for these arguments now, as lodash's ``flush()``; returns
        ``False`` when none is pending.

        The flush claims the flight at once and publishes the message that starts its run:
        the run covers the triggers pending now, and a trigger after the flush belongs to the
        next flight, which runs after its own wait. A live run of the key is not interrupted
        (``overlap=False``): the flight runs as soon as it finishes. Under
        ``task_always_eager`` the flight runs in this process before ``flush`` returns.
        """
        return self.flush_key(key_hash(self.name, self._key_of(args, kwargs)))

    def flush_key(self, hashed: str) -> bool:
        """``flush`` for a key hash (admin "run now"); returns whether a flight was pending."""
        backend = self.get_backend()
        pending = backend.pending_counts([hashed]).get(hashed, 0)
        dispatch = backend.flush(hashed, task_name=self.name, options=self.flight_options())
        if dispatch is not None:
            if is_eager(self):
                # the message that starts the run the flush claimed, delivered here
                self.fire(hashed, dispatch.seq, in_worker=False)
            else:
                # refused: the claimed run goes back to pending and a pump publishes it (I8)
                publish_or_release(self, backend, dispatch)
        return bool(pending)

    def cancel(self, *args: Any, **kwargs: Any) -> int:
        """Drop the pending flight for these arguments and reset the key's edge (lodash's
        ``cancel()``: the next trigger of a ``leading=True`` task leads at once); returns how
        many triggers were dropped. A run already claimed goes on."""
        return self.cancel_key(key_hash(self.name, self._key_of(args, kwargs)))

    def cancel_key(self, hashed: str) -> int:
        """``cancel`` for a key hash (admin "cancel pending")."""
        return self.get_backend().cancel(hashed, task_name=self.name, options=self.flight_options())

    def _key_of(self, args: tuple, kwargs: dict) -> str:
        """The key ``trigger(*args, **kwargs)`` counts under (of a whole collected batch)."""
        if self.debounce_collect and self.debounce_key is None:
            if args or kwargs:
                raise TypeError(
                    f"{self.name} collects every item under one key: flush(), cancel() and "
                    "status() act on the whole batch and take no item."
                )
            return self.name
        return self._resolve(args, kwargs)[0]

    # -- worker side ----------------------------------------------------------------------

    def apply_async(self, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any) -> Any:
        """Celery's ``apply_async``; a plain call (not a dispatch message) has its arguments
        checked against the body's signature at call time, as Celery does for ordinary tasks
        (``typing`` is off only so that dispatch messages may carry their reserved keyword)."""
        if not (kwargs and DISPATCH_KWARG in kwargs):
            self._binder.sig.bind(*(args or ()), **(kwargs or {}))
        for name, value in self.debounce_route.items():
            options.setdefault(name, value)  # the decorator's routing; the call's wins
        return super().apply_async(args, kwargs, *rest, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        message = kwargs.pop(DISPATCH_KWARG, None)
        if message is None:
            # A plain call (delay/apply_async/direct): not debounced, so no run facts.
            if self._wants_runinfo:
                kwargs.setdefault(RESERVED_PARAMETER, None)
            return super().__call__(*args, **kwargs)
        parsed = parse_message(message)
        if parsed is None:
            logger.error(
                "django_debounce: malformed dispatch message for %s dropped: %r",
                self.name,
                message,
            )
            return None
        try:
            return self.fire(parsed.key_hash, parsed.seq)
        except STORE_ERRORS as exc:
            return self._store_unavailable(message, exc)

    def _store_unavailable(self, message: dict[str, Any], exc: BaseException) -> None:
        """The store of a dispatch message is unreachable: deliver the same message again
        ``STORE_RETRY_DELAY`` later, at most ``STORE_RETRIES`` times (then the pump takes the
        flight again after ``DEBOUNCE_DISPATCH_GRACE``)."""
        attempt = int(message.get("n", 0)) + 1
        if attempt > STORE_RETRIES:
            logger.error(
                "django_debounce: store unreachable for %s, giving up on a dispatch "
                "message after %d attempts (%s); the pump takes its flight again",
                self.name,
                attempt - 1,
                exc,
            )
            return None
        logger.warning(
            "django_debounce: store unreachable for %s (%s); retrying in %ss",
            self.name,
            exc,
            STORE_RETRY_DELAY,
        )
        try:
            self.apply_async(
                kwargs={DISPATCH_KWARG: {**message, "n": attempt}},
                countdown=STORE_RETRY_DELAY,
                serializer="json",
            )
        except Exception:
            logger.exception("django_debounce: could not re-publish a dispatch message")

    def fire(self, hashed: str, seq: int | None, *, in_worker: bool = True) -> Any:
        """Handle one dispatch message (``seq=None``: in-process, no fencing); returns the body's
        result when this message claimed the flight, else ``None``."""
        backend = self.get_backend()
        decision = backend.fire(hashed, seq, task_name=self.name, options=self.flight_options())
        if decision.dispatch is not None and not is_eager(self):
            publish_or_release(self, backend, decision.dispatch)
        if decision.action is not FireAction.CLAIM or decision.claim is None:
            return None
        return self.run_claim(backend, decision.claim, in_worker=in_worker, seq=seq)

    def retry(  # type: ignore[override]
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: Any = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Any:
        """Celery's ``retry()``. Inside a debounced run it does not re-send the task: the
        run's triggers go back to pending and the flight runs again after ``countdown``
        seconds (default: the task's backoff), joined by triggers that arrive meanwhile,
        within ``max_retries`` (default: the task's). Raises ``celery.exceptions.Retry``."""
        if not getattr(self.request, "debounce_run", False):
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        if countdown is None and eta is not None:
            countdown = max((eta - dbtime.now()).total_seconds(), 0.0)
        raise _RetryRequested(exc, countdown, max_retries)

    def retry_delay(self, attempt: int) -> float:
        """Seconds before retry number ``attempt + 1``, from the task's Celery options:
        ``retry_backoff`` (exponential, capped by ``retry_backoff_max``, with
        ``retry_jitter``) when set, else ``default_retry_delay``."""
        backoff = getattr(self, "retry_backoff", False)
        if backoff:
            return float(
                get_exponential_backoff_interval(
                    factor=int(max(1.0, float(backoff))),
                    retries=attempt,
                    maximum=int(getattr(self, "retry_backoff_max", 600)),
                    full_jitter=bool(getattr(self, "retry_jitter", True)),
                )
            )
        return float(self.default_retry_delay or 0)

    def _call_body(self, args: list[Any], kwargs: dict[str, Any], attempt: int) -> Any:
        """Run the body under a request (``push_request``) that says "debounced run", with
        ``request.retries`` the attempt, so ``retry()`` does not re-send the task."""
        self.push_request(args=args, kwargs=kwargs, retries=attempt, debounce_run=True)
        try:
            return self.run(*args, **kwargs)
        finally:
            self.pop_request()

    def run_claim(
        self, backend: BaseBackend, claim: Claim, *, in_worker: bool = False, seq: int | None = None
    ) -> Any:
        """Execute the body for a claimed flight, then record the finish and schedule what
        arrived meanwhile. ``seq``: the sequence of the message that claimed it (``None``:
        claimed in-process).

        When the body raises (or calls ``retry()``), the claimed triggers go back to pending
        and run again after the task's backoff, up to ``max_retries`` times; then the failure
        is recorded. In a worker a retried failure raises ``celery.exceptions.Retry`` (Celery
        shows the task as retried); in-process (``run_due``, eager flush) and after the last
        retry, the body's exception propagates.
        """
        options = self.flight_options()
        if not claim.key:  # Redis keeps only a short key: the payload gives the full one
            claim = dataclasses.replace(claim, key=self.key_of_payload(claim.payload))
        info = RunInfo(
            key=claim.key,
            flight_id=claim.flight_id,
            run_id=claim.run_id,
            triggers=claim.triggers,
            first_trigger_at=claim.first_trigger_at,
            last_trigger_at=claim.last_trigger_at,
            attempt=claim.attempt,
            _heartbeat=partial(
                backend.heartbeat,
                claim.key_hash,
                claim.run_id,
                options.lease,
                task_name=self.name,
                options=options,
            ),
        )
        max_retries = self.max_retries
        if max_retries is not None and claim.attempt > max_retries:
            # Runs lost with their worker count as attempts too; only the triggers an attempt
            # covered are given up (Finish.give_up).
            error = (
                f"given up after {claim.attempt} attempts (max_retries={max_retries}); "
                "the last ones were lost with their worker"
            )
            self._finish(backend, claim, ok=False, error=error, give_up=True)
            observe.run_finished(self, claim, time.monotonic(), observe.FAILURE, error)
            return None
        args, kwargs = self.call_arguments(claim.payload)
        if self._wants_runinfo:
            kwargs[RESERVED_PARAMETER] = info
        started = observe.run_started(self, claim)
        try:
            # A pool process says which run it executes until the body ends, for the lease
            # keeper (runtable.py).
            with runtable.executing(claim.key_hash, seq, claim.key):
                result = self._call_body(args, kwargs, claim.attempt)
        except Exception as exc:
            # retried: every exception, unless the task names autoretry_for, which narrows
            # retries to those (Celery's autoretry_for calls retry()), as in Celery
            countdown, cause, retried = None, exc, not getattr(self, "autoretry_for", None)
            if isinstance(exc, _RetryRequested):
                countdown, cause, retried = exc.countdown, exc.exc or exc, True
                if exc.max_retries is not None:
                    max_retries = exc.max_retries
            retry_in = None
            if retried and (max_retries is None or claim.attempt < max_retries):
                retry_in = countdown if countdown is not None else self.retry_delay(claim.attempt)
                retry_in = min(max(float(retry_in), 0.0), conf.MAX_SECONDS)
            error = "".join(traceback.format_exception_only(type(cause), cause)).strip()
            self._finish(backend, claim, ok=False, error=error, retry_in=retry_in)
            outcome = observe.FAILURE if retry_in is None else observe.RETRY
            observe.run_finished(self, claim, started, outcome, error)
            if retry_in is not None:
                logger.warning(
                    "django_debounce: %s run %s of %r failed (%s); retry %d in %.3gs",
                    self.name,
                    claim.run_id,
                    claim.key,
                    error,
                    claim.attempt + 1,
                    retry_in,
                )
                if in_worker:
                    raise Retry(message=None, exc=cause, when=retry_in) from cause
            if cause is not exc:
                raise cause from None
            raise
        self._finish(backend, claim, ok=True)
        observe.run_finished(self, claim, started, observe.SUCCESS)
        return result

    def _finish(self, backend: BaseBackend, claim: Claim, **finish: Any) -> None:
        """Record the end of ``claim``'s run (``finish``: the fields of ``Finish``) and
        publish the follow-up flight the store answers with."""
        try:
            follow = backend.finish(
                claim.key_hash,
                claim.run_id,
                Finish(started_at=claim.started_at, **finish),
                task_name=self.name,
                options=self.flight_options(),
            )
        except STORE_ERRORS:
            # The run is done but its store is unreachable: its lease runs out and the
            # flight is redone (at least once, I7) rather than lost.
            logger.exception(
                "django_debounce: could not record the finish of %s run %s", self.name, claim.run_id
            )
            return
        if follow is not None and not is_eager(self):
            if not follow.label:
                follow = dataclasses.replace(follow, label=claim.key)
            publish_or_release(self, backend, follow)


def deferring_alias(using: str | None) -> str | None:
    """The database whose open transaction a trigger waits for (``None``: none is open, the
    trigger counts at once): ``using``'s when given; else the default database's, else the
    first in ``DATABASES`` order with one open (docs/guide/integration.md, "Transactions")."""
    if using is not None:
        return using if connections[using].in_atomic_block else None
    if connections[DEFAULT_DB_ALIAS].in_atomic_block:
        return DEFAULT_DB_ALIAS
    for alias in connections:
        if alias != DEFAULT_DB_ALIAS and connections[alias].in_atomic_block:
            return str(alias)
    return None


class _CommitBatch:
    """The triggers of one thread waiting for one commit of one database, each with a
    callback of its own (held by weak reference: one a savepoint rollback dropped is left
    out). The first callback to run sends the batch, one ``trigger_many`` per task and run of
    equal per-call options (docs/guide/imports.md)."""

    def __init__(self) -> None:
        self.entries: list[tuple[Any, DebouncedTask, list[Any], FlightOptions | None]] = []
        self.sent = False

    def send(self) -> None:
        if self.sent:
            return
        self.sent = True
        runs: list[list[Any]] = []
        last: dict[str, list[Any]] = {}  # each task's triggers stay in order
        for ref, task, resolved, options in self.entries:
            if ref() is None:
                continue  # dropped by a savepoint rollback
            run = last.get(task.name)
            if run is None or run[2] != options:
                run = last[task.name] = [[], task, options]
                runs.append(run)
            run[0].extend(resolved)
        self.entries = []
        failed: BaseException | None = None
        for resolved, task, options in runs:
            try:
                task._trigger_batch(resolved, options)
            except Exception as exc:  # the other tasks' triggers still go out
                logger.exception("django_debounce: triggers of %s at commit failed", task.name)
                failed = failed or exc
        if failed is not None:
            raise failed


_batches = threading.local()


def _defer(
    alias: str,
    task: DebouncedTask,
    resolved: list[tuple[str, Any, str]],
    options: FlightOptions | None,
) -> None:
    """Count ``resolved`` when ``alias``'s transaction commits, in that commit's batch."""
    open_ = _batches.__dict__.setdefault("by_alias", {})
    batch = open_.get(alias)
    if batch is None or batch.sent:
        batch = open_[alias] = _CommitBatch()

    def waiting() -> None:  # a function: Django < 6.1 logs a robust callback's __qualname__
        batch.send()

    batch.entries.append((weakref.ref(waiting), task, resolved, options))
    # robust: a failure is logged by Django and the caller's later callbacks still run
    transaction.on_commit(waiting, using=alias, robust=True)
