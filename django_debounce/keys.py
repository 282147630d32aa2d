"""Building keys from a task's arguments, and hashing them for the stores."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any

from django_debounce import argtypes, conf
from django_debounce.exceptions import IntegerTooLong, UnsupportedArgument

RESERVED_PARAMETER = "debounce"
# A NUL character in JSON: "\u0000" after an even number of backslashes (an escaped backslash
# followed by "u0000" is text, not a NUL).
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


# One encoder for every payload: ``json.dumps`` with these options builds a new encoder per
# call, a third of its cost for a small payload. ``default`` encodes the types of Django's
# ``DjangoJSONEncoder`` in one canonical form each (argtypes.py).
_encode = json.JSONEncoder(
    sort_keys=True,
    separators=(",", ":"),
    ensure_ascii=False,
    allow_nan=False,
    default=argtypes.encode,
).encode


def dumps(value: Any) -> str:
    """Canonical JSON (sorted keys, no spaces, UTF-8 kept): the only encoding we store or send.

    Besides JSON's own types, ``value`` may hold those of Django's ``DjangoJSONEncoder``
    (``argtypes.encode`` gives their canonical forms). Raises ``UnsupportedArgument`` (a
    ``TypeError``) naming the type of the offending value when ``value`` holds any other,
    and ``ValueError`` for JSON no store can keep: a string with a NUL character (PostgreSQL
    refuses it), a lone surrogate (not UTF-8), nesting deeper than Python's recursion limit,
    an integer longer than Python's ``int_max_str_digits`` (``IntegerTooLong``), and
    ``UnsupportedArgument`` for an aware ``datetime`` with no UTC form.
    """
    try:
        encoded = _encode(value)
    except UnsupportedArgument:  # argtypes' own (an aware datetime with no UTC form)
        raise
    except (TypeError, ValueError) as exc:
        _check_int_digits(value)
        try:
            offender = _offender(value)
        except RecursionError:  # a list or dict that holds itself
            offender = None
        if offender is None:
            offender = value
        raise UnsupportedArgument(
            f"django-debounce stores payloads as JSON and cannot encode a value of type "
            f"{type(offender).__name__} ({_short_repr(offender)}): {exc}. Pass JSON values "
            f"(str, int, float, bool, None, lists, dicts with str keys) or values of type "
            f"{argtypes.SUPPORTED_NAMES}: for example a primary key instead of a model "
            "instance, a list instead of a set."
        ) from None
    except RecursionError:
        raise ValueError(
            "django-debounce cannot store this payload: it is nested too deeply for JSON "
            "(Python's recursion limit). Pass a flat value, such as a primary key."
        ) from None
    check_text(encoded, "payload")
    return encoded


def _check_int_digits(value: Any) -> None:
    """Raise ``IntegerTooLong`` naming the limit and the fix when ``value`` holds an integer
    that Python refuses to turn into text (more than ``sys.get_int_max_str_digits()``
    digits); JSON's own error only says "Exceeds the limit (4300 digits) for integer string
    conversion". Called on the error path only: it walks the whole value."""
    limit = sys.get_int_max_str_digits()
    if not limit:
        return
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if isinstance(item, int):
            if item.bit_length() > limit * 3:  # 3.32 bits a digit: a cheap pre-check
                try:
                    int.__repr__(item)
                except ValueError:
                    raise IntegerTooLong(
                        f"django-debounce cannot store an integer of more than {limit:,} "
                        f"digits (about {int(item.bit_length() * math.log10(2)) + 1:,}): "
                        "payloads are JSON text, and Python turns at most "
                        "sys.get_int_max_str_digits() digits into text. Pass the number as "
                        "a string (str(n) after sys.set_int_max_str_digits(0) in your code) "
                        "and convert it in the task body, or raise the limit "
                        "(sys.set_int_max_str_digits(), PYTHONINTMAXSTRDIGITS) in every "
                        "process that triggers or runs the task."
                    ) from None
        elif isinstance(item, (list, tuple, dict)) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(item.values() if isinstance(item, dict) else item)


def check_text(text: str, what: str) -> None:
    """Raise ``ValueError`` naming the fix when ``text`` (a key or encoded payload) holds a
    NUL character (U+0000, escaped in JSON; PostgreSQL's text and jsonb refuse it) or is not
    valid UTF-8 (a lone surrogate)."""
    if "\x00" in text or ("\\u0000" in text and _NUL.search(text)):
        raise ValueError(
            f"django-debounce cannot store a {what} with a NUL character (U+0000): remove it "
            "(PostgreSQL's text and jsonb types cannot hold it)."
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"django-debounce cannot store a {what} that is not valid UTF-8 (a lone "
                "surrogate such as '\\ud800'): pass text that encodes as UTF-8."
            ) from None


def check_size(encoded: str, task_name: str) -> None:
    """Raise ``ValueError`` when a stored payload is larger than ``DEBOUNCE_MAX_PAYLOAD``
    bytes (checked before anything is stored)."""
    limit = int(conf.get("MAX_PAYLOAD"))
    if len(encoded) > limit // 4 and len(encoded.encode("utf-8")) > limit:
        raise ValueError(
            f"{task_name}: the payload of a trigger is {len(encoded.encode('utf-8')):,} bytes "
            f"of JSON, more than DEBOUNCE_MAX_PAYLOAD ({limit:,}): pass an identifier (such "
            "as a primary key) and let the task read the rest, or raise the setting."
        )


def _offender(value: Any) -> Any:
    """The first value inside ``value`` that the encoder refuses, ``None`` when none is
    found (for error messages)."""
    if isinstance(value, float):
        return None if math.isfinite(value) else value
    if value is None or isinstance(value, (str, int, *argtypes.SUPPORTED)):
        return None
    if isinstance(value, (list, tuple)):
        items: Any = value
    elif isinstance(value, dict):
        for k in value:
            if k is not None and not isinstance(k, (str, int, float)):
                return k
        items = value.values()
    else:
        return value
    for item in items:
        found = _offender(item)
        if found is not None:
            return found
    return None


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = object.__repr__(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def key_hash(task_name: str, key: str) -> str:
    """The store identity of a key: SHA-256 hex of task name and readable key.

    Hashing makes any length or character safe in every store; including the task name
    keeps the same readable key of two tasks independent. Short keys are remembered, so a
    burst of triggers on one key hashes it once.
    """
    return _sha256(task_name, key) if len(key) > 256 else _remembered(task_name, key)


def _sha256(task_name: str, key: str) -> str:
    return hashlib.sha256(f"{task_name}\n{key}".encode()).hexdigest()


# Keys of up to 256 characters only: a few MB at most.
_remembered = functools.lru_cache(maxsize=4096)(_sha256)


class PayloadBinder:
    """Binds a trigger's arguments to the signature of ``func`` (without its keyword-only
    ``debounce`` parameter), defaults applied: ``{"args": [...], "kwargs": {...}}``, so
    ``f(1)`` and ``f(x=1)`` give the same payload (and so the same default key). Raises
    ``TypeError`` as a call would.

    A body whose parameters are all positional-or-keyword, called with positional arguments
    only, binds without ``inspect`` (every trigger is a hot path).
    """

    def __init__(self, func: Callable[..., Any]) -> None:
        sig = inspect.signature(func)
        params = [p for name, p in sig.parameters.items() if name != RESERVED_PARAMETER]
        self.sig = sig.replace(parameters=params)
        self.simple = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
        self.size = len(params)
        self.defaults = [p.default for p in params]
        self.required = sum(1 for p in params if p.default is p.empty)
        if self.simple and any(p.default is p.empty for p in params[self.required :]):
            self.simple = False  # a required parameter after a defaulted one: let inspect say

    def __call__(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        n = len(args)
        if self.simple and not kwargs and self.required <= n <= self.size:
            return {"args": [*args, *self.defaults[n:]], "kwargs": {}}
        bound = self.sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return {"args": list(bound.args), "kwargs": dict(bound.kwargs)}
