"""``@debounced_receiver``: a Django signal receiver whose handler runs in a Celery worker
once per burst per row (docs/guide/integration.md, "Receivers")."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any, TypeVar

from celery import shared_task
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import models, router
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save
from django.dispatch import Signal
from django.utils.inspect import func_accepts_kwargs

from django_debounce.keys import check_size, check_text, dumps, key_hash
from django_debounce.options import DebounceOptions, check_not_async, task_base
from django_debounce.state import RunInfo
from django_debounce.tasks import DebouncedTask

F = TypeVar("F", bound=Callable[..., Any])


def _signal_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A signal's keyword arguments that JSON can hold (a set as a sorted list), without
    ``signal``, ``sender`` and ``instance``."""
    out = {}
    for name, value in kwargs.items():
        if name in ("signal", "sender", "instance"):
            continue
        if isinstance(value, (set, frozenset)):
            value = sorted(value, key=repr)
        if value is not None and type(value) not in (bool, str):  # those always encode
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue
        out[name] = value
    return out


def _pk(value: Any) -> Any:
    return value if isinstance(value, (int, str)) else str(value)


def _check_receiver_key(name: str, key: Callable[..., str], collect: bool) -> None:
    """A receiver's ``key=`` is called with the payload's fields as keywords; check that its
    signature takes them at decoration time, not in the middle of a user's ``save()``."""
    fields = ("model", "pk") if collect else ("model", "pk", "sender", "signal", "kwargs")
    try:
        inspect.signature(key).bind(**dict.fromkeys(fields))
    except TypeError as exc:
        raise ImproperlyConfigured(
            f"key= of receiver {name} must accept the keyword arguments {', '.join(fields)} "
            f"(for example `lambda model, pk, **kw: ...`): {exc}."
        ) from None
    except ValueError:  # no signature to inspect (a builtin): checked when called
        pass


def _label(obj: Any) -> str | None:
    """The ``app_label.model`` of a model class; ``None`` for anything else."""
    if isinstance(obj, type) and issubclass(obj, models.Model):
        return str(obj._meta.label_lower)  # type: ignore[attr-defined]
    return None


def _write_alias(label: str | None) -> str | None:
    """The database the model ``label`` writes to (``None``: no label, or no such model)."""
    if not label:
        return None
    try:
        return str(router.db_for_write(apps.get_model(label)))
    except LookupError:
        return None


_NOTHING = object()

# The keyword values Django's model signals usually send (``using`` is added: the database the
# model writes to): left out of a receiver's stored payload and put back when it is read.
USUAL_KWARGS: dict[Signal, dict[str, Any]] = {
    post_save: {"created": False, "update_fields": None, "raw": False},
    pre_save: {"update_fields": None, "raw": False},
    post_delete: {},
    pre_delete: {},
    m2m_changed: {"reverse": False},
}


class DebouncedReceiverTask(DebouncedTask):
    """Task behind ``@debounced_receiver``: the payload names a row, the body re-reads it."""

    debounce_signals: tuple[Signal, ...] = ()
    debounce_call_missing: bool = False
    debounce_raw: bool = False
    debounce_handler: Callable[..., Any] | None = None
    debounce_sender: Any = None

    def _resolve(self, args: tuple, kwargs: dict) -> tuple[str, Any, str]:
        """``trigger(instance)`` or ``trigger(Model, pk)``: key ``app_label.model:pk``
        (collect mode: the item ``{"model", "pk"}`` under the key ``app_label.model``).
        Raises ``TypeError`` for other arguments, a row of a model other than ``sender=``'s,
        and a primary key that cannot name a row (``None``: an unsaved instance)."""
        if len(args) == 1 and not kwargs and isinstance(args[0], models.Model):
            model, pk = type(args[0]), args[0].pk
        elif len(args) == 2 and not kwargs and _label(args[0]):
            model, pk = args
        else:
            raise TypeError(
                f"{self.name}.trigger() takes a model instance, or a model class and a primary "
                f"key; got args={args!r} kwargs={kwargs!r}."
            )
        sender = self.debounce_sender
        if _label(sender):
            concrete = sender._meta.concrete_model
            if not issubclass(model, sender) and model._meta.concrete_model is not concrete:
                raise TypeError(
                    f"{self.name} receives {sender._meta.label} rows (sender=); "
                    f"got a {model._meta.label}."
                )
        if pk is None:
            raise TypeError(
                f"{self.name}.trigger() needs a saved row: the {model._meta.label} has no "
                "primary key yet (save it first, or trigger from post_save)."
            )
        try:
            model._meta.pk.to_python(pk)
        except ValidationError as exc:
            raise TypeError(
                f"{self.name}.trigger() got {pk!r}, which is not a primary key of "
                f"{model._meta.label}: {'; '.join(exc.messages)}"
            ) from None
        return self._resolved(
            {
                "model": _label(model),
                "pk": _pk(pk),
                "sender": None,
                "signal": None,
                "kwargs": {},
            }
        )

    def _resolved(self, payload: dict[str, Any]) -> tuple[str, Any, str]:
        """``(key, payload, stored JSON)`` of a row payload (collect mode: of its item
        ``{"model", "pk"}``). Raises ``ValueError`` for a payload or key no store can keep."""
        if self.debounce_collect:
            payload = {"model": payload["model"], "pk": payload["pk"]}
            stored = dumps(self.pack_item(payload))
        else:
            stored = dumps(self.pack(payload))
        check_size(stored, self.name)
        key = self.key_for(payload)
        check_text(key, "key")
        return key, payload, stored

    # -- the stored payload: a model code and the pk ----------------------------------------

    def alias_of(self, payload: Any) -> str | None:
        """The database the row's model writes to (``router.db_for_write``): a trigger made
        inside that database's transaction counts when it commits."""
        return _write_alias(payload.get("model") if isinstance(payload, dict) else None)

    def _default_label(self) -> str | None:
        return _label(self.debounce_sender)

    def pack(self, payload: dict[str, Any]) -> list[Any]:
        """The stored form of a row payload, compact (a lean Redis hash): ``[pk, signal,
        kwargs, model, sender]`` with trailing defaults left out (signal 0, the signal's usual
        keyword values, the receiver's sender model, sender = model for a signal and ``None``
        for a trigger by hand), so a save of a row is stored as ``[pk]`` or
        ``[pk, 0, {"created": true}]``."""
        model, signal = payload["model"], payload["signal"]
        usual = self._usual_kwargs(signal, model)
        kwargs = {k: v for k, v in payload["kwargs"].items() if usual.get(k, _NOTHING) != v}
        out = [payload["pk"], signal, kwargs, model, payload["sender"]]
        defaults = [_NOTHING, 0, {}, self._default_label(), model if signal is not None else None]
        while len(out) > 1 and out[-1] == defaults[len(out) - 1]:
            out.pop()
        return out

    def unpack(self, stored: Any) -> dict[str, Any]:
        """The row payload of a stored one (``pack``'s form)."""
        pk = stored[0]
        signal = stored[1] if len(stored) > 1 else 0
        kwargs = stored[2] if len(stored) > 2 else {}
        model = stored[3] if len(stored) > 3 else self._default_label()
        sender = stored[4] if len(stored) > 4 else (model if signal is not None else None)
        return {
            "model": model,
            "pk": pk,
            "sender": sender,
            "signal": signal,
            "kwargs": {**self._usual_kwargs(signal, model), **kwargs},
        }

    def pack_item(self, item: dict[str, Any]) -> Any:
        """A collected item's stored form: the pk alone for a row of the sender model."""
        if item["model"] == self._default_label():
            return item["pk"]
        return [item["model"], item["pk"]]

    def unpack_item(self, stored: Any) -> dict[str, Any]:
        """A collected item from its stored form (``pack_item``'s)."""
        if isinstance(stored, list):
            return {"model": stored[0], "pk": stored[1]}
        return {"model": self._default_label(), "pk": stored}

    def _usual_kwargs(self, signal: int | None, model: str | None) -> dict[str, Any]:
        """The keyword values ``signal`` (an index into the receiver's signals) usually sends,
        left out of the stored payload and put back when it is read."""
        if signal is None or signal >= len(self.debounce_signals):
            return {}
        usual = dict(USUAL_KWARGS.get(self.debounce_signals[signal], {}))
        alias = _write_alias(model) if usual else None
        if alias is not None:
            usual["using"] = alias
        return usual

    def call_arguments(self, payload: Any) -> tuple[list[Any], dict[str, Any]]:
        """The receiver body takes the payload's fields as keywords (collect mode: the list
        of items)."""
        if self.debounce_collect:
            return [[self.unpack_item(item) for item in payload or []]], {}
        return [], self.unpack(payload)

    def key_of_payload(self, payload: Any) -> str:
        """The readable key of a stored payload (see ``DebouncedTask.key_of_payload``)."""
        if self.debounce_collect:
            items = list(payload or [])
            return self.key_for(self.unpack_item(items[0])) if items else self.name
        return self.key_for(self.unpack(payload))

    def key_for(self, payload: dict[str, Any]) -> str:
        """The key of a trigger: ``key(**payload)``, else ``app_label.model:pk`` (collect
        mode: ``app_label.model``)."""
        if self.debounce_key is not None:
            return self._checked_key(self.debounce_key(**payload))
        if self.debounce_collect:
            return str(payload["model"] or payload.get("sender") or "signal")
        if payload["model"] is None:
            return f"{payload['sender'] or 'signal'}"
        return f"{payload['model']}:{payload['pk']}"

    def before_send(self, resolved: list[tuple[str, Any, str]]) -> list[tuple[str, Any, str]]:
        """With ``raw=True``, a raw save's trigger goes to the store as a real one (``raw``
        false) when an earlier trigger of its key in ``resolved``, or the key's pending
        flight, was a real save: a run is handed ``raw=True`` only if every trigger it
        covers was raw. One query for the batch's raw keys."""
        if not self.debounce_raw or self.debounce_collect:
            return resolved
        raw = {key: key_hash(self.name, key) for key, p, _ in resolved if _raw(p)}
        if not raw:
            return resolved
        from django_debounce.models import DebounceKey  # see DebouncedTask.status

        real = {
            hashed
            for hashed, stored in DebounceKey.objects.using(router.db_for_write(DebounceKey))
            .filter(key_hash__in=list(raw.values()), pending__gt=0)
            .values_list("key_hash", "payload")
            if not _raw(self.unpack(stored))
        }
        out = []
        for key, payload, stored in resolved:
            hashed = raw.get(key) or key_hash(self.name, key)
            if not _raw(payload):
                real.add(hashed)
            elif hashed in real:
                payload = {**payload, "kwargs": {**payload["kwargs"], "raw": False}}
                stored = dumps(self.pack(payload))
            out.append((key, payload, stored))
        return out

    def on_signal(self, signal: Signal, sender: Any, **kwargs: Any) -> None:
        """Web side: one trigger per signal, deferred to the commit of the writing database.
        A raw save (``loaddata``) is left out unless the receiver has ``raw=True``."""
        if kwargs.get("raw") and not self.debounce_raw:
            return
        instance = kwargs.get("instance")
        index = self.debounce_signals.index(signal) if signal in self.debounce_signals else None
        payload = {
            "model": instance._meta.label_lower if isinstance(instance, models.Model) else None,
            "pk": _pk(instance.pk) if isinstance(instance, models.Model) else None,
            "sender": _label(sender),
            "signal": index,
            "kwargs": _signal_kwargs(kwargs),
        }
        if self.debounce_collect and payload["model"] is None:
            raise TypeError(
                f"{self.name} collects rows (collect=True) but {signal!r} sent no model "
                "instance; use collect=False for signals without an instance."
            )
        key, payload, stored = self._resolved(payload)
        self.trigger_payload(key, payload, using=kwargs.get("using"), payload_json=stored)


def _raw(payload: Any) -> bool:
    """Whether a receiver's row payload is a raw save's."""
    return bool(isinstance(payload, dict) and (payload.get("kwargs") or {}).get("raw"))


def _receiver_body() -> Callable[..., Any]:
    def body(
        task: Any,
        model: str | None,
        pk: Any,
        sender: str | None,
        signal: int | None,
        kwargs: dict[str, Any],
        *,
        debounce: RunInfo,
    ) -> Any:
        handler = task.debounce_handler
        sig = task.debounce_signals[signal] if signal is not None else None
        model_cls = apps.get_model(model) if model else None
        instance = None
        if model_cls is not None and pk is not None:
            # The database the model writes to, never a read replica.
            alias = router.db_for_write(model_cls)
            instance = model_cls._default_manager.using(alias).filter(pk=pk).first()
            if instance is None and sig is not post_delete and not task.debounce_call_missing:
                return None
            pk = model_cls._meta.pk.to_python(pk)  # the model's own type (a UUID, ...)
        sender_cls = apps.get_model(sender) if sender else model_cls
        return handler(
            sender=sender_cls, pk=pk, instance=instance, signal=sig, debounce=debounce, **kwargs
        )

    return body


def _collect_body() -> Callable[..., Any]:
    def body(task: Any, items: list[dict[str, Any]], *, debounce: RunInfo) -> Any:
        pks = [apps.get_model(item["model"])._meta.pk.to_python(item["pk"]) for item in items]
        by_model: dict[str, list[Any]] = {}
        for item in items:
            by_model.setdefault(item["model"], []).append(item["pk"])
        found: dict[tuple[str, str], Any] = {}
        for label, model_pks in by_model.items():
            model_cls = apps.get_model(label)
            alias = router.db_for_write(model_cls)  # never a read replica
            for obj in model_cls._default_manager.using(alias).filter(pk__in=model_pks):
                found[(label, str(obj.pk))] = obj
        instances = [
            found[(i["model"], str(i["pk"]))] for i in items if (i["model"], str(i["pk"])) in found
        ]
        sender = task.debounce_sender
        if not _label(sender):
            sender = apps.get_model(items[0]["model"]) if items else None
        signals = task.debounce_signals
        return task.debounce_handler(
            sender=sender,
            pks=pks,
            instances=instances,
            signal=signals[0] if len(signals) == 1 else None,
            debounce=debounce,
        )

    return body


def _check_handler(handler: Callable[..., Any], collect: bool) -> None:
    """A receiver's handler is called with keywords only, the signal's own among them, so it
    must take ``**kwargs``, as Django asks of every signal receiver (a collecting handler may
    instead name exactly ``sender, pks, instances, signal, debounce``); checked at decoration
    rather than in the worker, where the run would fail and be retried."""
    if not callable(handler):
        raise TypeError(f"debounced_receiver decorates a function, got {handler!r}.")
    check_not_async(handler, "debounced_receiver")
    if collect:
        fields = "sender, pks, instances, signal"
        try:
            inspect.signature(handler).bind(
                sender=None, pks=[], instances=[], signal=None, debounce=None
            )
            return
        except TypeError:
            pass
    else:
        fields = "sender, pk, instance, signal"
    if not func_accepts_kwargs(handler):
        raise TypeError(
            f"The handler {getattr(handler, '__qualname__', handler)!r} of debounced_receiver "
            f"must accept **kwargs: it is called with keywords ({fields}, debounce, and the "
            "signal's own such as created or update_fields). Write it as "
            f"def {getattr(handler, '__name__', 'handler')}(sender, **kwargs) or name the "
            "keywords you use before **kwargs."
        )


def debounced_receiver(
    signal: Signal | list[Signal] | tuple[Signal, ...],
    *,
    sender: Any = None,
    call_missing: bool = False,
    raw: bool = False,
    **options: Any,
) -> Callable[[F], Any]:
    """Connect a handler to ``signal`` so it runs in a Celery worker once per burst per row.

    The handler is called later, in the worker, with keyword arguments ``sender``, ``pk``,
    ``instance`` (re-read from the database the model writes to; ``None`` when the row is
    gone, and then the handler is called only for ``post_delete`` or with
    ``call_missing=True``), ``signal``, the JSON-safe signal kwargs of the last trigger
    (``created``, ``update_fields``, ``using``, ...) and ``debounce`` (a ``RunInfo``).
    The default key is ``app_label.model:pk``; ``key=`` receives the payload's fields
    (``model``, ``pk``, ``sender``, ``signal``, ``kwargs``) as keywords.
    With ``collect=True`` the handler is called once per flight with ``pks`` and
    ``instances`` (lists in trigger order; rows gone from the database are left out of
    ``instances``) instead of ``pk`` and ``instance``; the default key is the model label.

    ``options`` are those of ``debounced_task``: this app's (``DebounceOptions``) and any
    Celery task option except ``bind=True``. Returns the task (use it with ``trigger_many``
    after bulk writes, or ``.flush(instance)``). Triggers made in a transaction count when it
    commits (``on_commit``), all of that commit's in one batch. Raw saves (``loaddata``, a
    ``pre_save``/``post_save`` with ``raw=True``) trigger nothing unless ``raw=True``; then
    a run gets ``raw=True`` only when every trigger it covers was raw.
    Raises ``ImproperlyConfigured`` for invalid options, ``TypeError`` for unknown ones and
    for a handler that does not take ``**kwargs``.
    """
    debounce, celery_options = DebounceOptions.split(
        options, extra=("sender", "call_missing", "raw")
    )
    if celery_options.pop("bind", False):
        raise ImproperlyConfigured(
            "debounced_receiver does not take bind=True: its handler is called with keyword "
            "arguments only (sender, pk, instance, signal, debounce, ...)."
        )
    signals = tuple(signal) if isinstance(signal, (list, tuple)) else (signal,)
    for sig in signals:
        if not isinstance(sig, Signal):
            raise TypeError(f"debounced_receiver expects a django.dispatch.Signal, got {sig!r}.")
    collect, key = debounce.collect, debounce.key
    base = task_base(celery_options.pop("base", None), DebouncedReceiverTask, "debounced_receiver")

    def decorate(handler: F) -> Any:
        _check_handler(handler, collect)
        name = celery_options.pop("name", f"{handler.__module__}.{handler.__qualname__}")
        if key is not None:
            _check_receiver_key(name, key, collect)
        body = _collect_body() if collect else _receiver_body()
        for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
            setattr(body, attr, getattr(handler, attr))
        task = shared_task(
            base=base,
            name=name,
            bind=True,
            **debounce.task_attributes(),
            debounce_signals=signals,
            debounce_call_missing=call_missing,
            debounce_raw=bool(raw),
            debounce_handler=staticmethod(handler),
            debounce_sender=sender,
            **celery_options,
        )(body)

        def on_signal(signal: Signal, sender: Any, **kwargs: Any) -> None:
            if getattr(getattr(sender, "_meta", None), "app_label", None) == "django_debounce":
                # This app's own rows are written by triggers and runs: a receiver without
                # sender= would trigger itself again on every save, without end.
                return
            task.on_signal(signal, sender, **kwargs)

        for sig in signals:
            sig.connect(
                on_signal, sender=sender, weak=False, dispatch_uid=f"django_debounce:{name}"
            )
        return task

    return decorate
