"""The options one trigger call gives for itself (``task.trigger(x, debounce_wait=0)``: its
own ``wait`` and ``max_wait`` today), declared once for the tests.

A test carries a call's options as one mapping, ``own`` (``{"wait": 0}``; an option left out
is the task's), never as one argument per option. From here:

- ``call_options()``: the Hypothesis strategy of ``own`` that every property test draws from
  (``tests/unit/test_machine_properties.py``, ``tests/stores/test_properties.py``, the fault
  table's ``tests/stores/test_failover_properties.py``): any subset of ``PER_CALL``, each
  with one of its kind's sample values, so every per-call option the package declares is
  drawn there;
- ``resolve(base, own)``: the ``FlightOptions`` a store gets for that call, made by the
  package's own code (what ``trigger()`` makes of its keywords);
- ``rules_options(model, own)``: the same call's options as the rules resolve them
  (``KeyModel.options``), every one named, for ``KeyModel.trigger``/``fold`` by keyword
  (``tests/support/rules.py``);
- ``keywords(own)``: the keywords of ``trigger()`` (``debounce_<name>``);
- ``bad_calls()``: values ``trigger()`` must refuse, and a word of its error
  (``tests/stores/test_bad_input.py``);
- ``other_value(base, option)``: a value of ``option`` that changes a task's flight options
  (``tests/stores/test_counters.py``: each option is in the counter's fingerprint).

``PER_CALL`` is the package's own table of them, ``django_debounce.options.TRIGGER_OPTIONS``
(keyword, ``FlightOptions`` field, check), each given the kind of its field's type
(``KINDS``: a duration today). ``tests/unit/test_call_options.py`` checks it against every
other place of the package that names them (``KeyModel.options``, the decorators' reserved
parameters). A new per-call option of a known kind is drawn with no edit here; one of a new
kind needs its ``Kind`` in ``KINDS``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from django_debounce.options import TRIGGER_OPTIONS, trigger_options
from django_debounce.state import FlightOptions


@dataclass(frozen=True)
class Kind:
    """What values an option takes: ``samples`` (drawn by the property tests, in seconds for
    a duration; near the drawn tasks' waits, 0.5 and 2 s, and leases, 1 to 10 s: at once,
    shorter, between, longer), ``bad`` (``trigger()`` refuses them: ``(value, a word of the
    error)``), and whether a value is a duration (``seconds``: scaled to a tier's unit)."""

    samples: tuple[Any, ...]
    bad: tuple[tuple[Any, str], ...]
    seconds: bool


SECONDS = Kind(
    samples=(0.0, 0.25, 0.75, 3.0, 4.0),
    bad=(
        (1e12, "a year"),
        (-1, "from 0 to"),
        (float("inf"), "a year"),
        ("5s", "seconds"),
        (True, "seconds"),
    ),
    seconds=True,
)


@dataclass(frozen=True)
class CallOption:
    """One option of a trigger call: ``name`` is its ``FlightOptions`` field and its
    ``KeyModel.options`` parameter; ``trigger()`` takes it as ``debounce_<name>``."""

    name: str
    kind: Kind

    @property
    def keyword(self) -> str:
        return f"debounce_{self.name}"

    def samples(self, unit: int | float = 1) -> tuple[Any, ...]:
        """The values the property tests draw, in ``unit`` (1: seconds; ``US``: the rules'
        integer microseconds)."""
        if not self.kind.seconds or unit == 1:
            return self.kind.samples
        return tuple(round(v * unit) for v in self.kind.samples)


# The kind of a per-call option by the type of its FlightOptions field.
KINDS: dict[str, Kind] = {"float": SECONDS, "float | None": SECONDS}


def declared() -> tuple[CallOption, ...]:
    """The options a trigger call gives for itself, as the package declares them
    (``options.TRIGGER_OPTIONS``), each of the kind of its ``FlightOptions`` field's type."""
    types = {f.name: str(f.type) for f in dataclasses.fields(FlightOptions)}
    options = []
    for keyword, (name, _check) in TRIGGER_OPTIONS.items():
        assert keyword == f"debounce_{name}", f"{keyword}= does not name its field {name}"
        assert name in types, f"trigger()'s {keyword}= names no field of FlightOptions"
        assert types[name] in KINDS, (
            f"trigger()'s {keyword}= is a {types[name]}: give tests/support/call_options.py's "
            "KINDS a Kind for it (the values the property tests draw, the bad ones)"
        )
        options.append(CallOption(name, KINDS[types[name]]))
    return tuple(options)


PER_CALL: tuple[CallOption, ...] = declared()
NAMES = tuple(option.name for option in PER_CALL)


def call_options(
    *, unit: int | float = 1, plain: int = 1, given: int = 2
) -> st.SearchStrategy[dict[str, Any]]:
    """A call's own options: ``{}`` (a plain trigger, the task's options) ``plain`` times in
    ``plain + given``, else a non-empty subset of ``PER_CALL``, each with one of its samples
    (in ``unit``). Shrinks towards a plain trigger."""

    @st.composite
    def draw_own(draw: Any) -> dict[str, Any]:
        if draw(st.integers(1, plain + given)) <= plain:
            return {}
        names = draw(st.sets(st.sampled_from(NAMES), min_size=1))
        return {
            option.name: draw(st.sampled_from(option.samples(unit)))
            for option in PER_CALL
            if option.name in names
        }

    return draw_own()


def _in_seconds(own: Mapping[str, Any], unit: int | float) -> dict[str, Any]:
    by_name = {option.name: option for option in PER_CALL}
    unknown = set(own) - set(by_name)
    assert not unknown, f"not options of a trigger call: {sorted(unknown)} (PER_CALL: {NAMES})"
    return {
        name: value / unit
        if value is not None and by_name[name].kind.seconds and unit != 1
        else value
        for name, value in own.items()
    }


def resolve(base: FlightOptions, own: Mapping[str, Any], *, unit: int | float = 1) -> FlightOptions:
    """The flight options of a trigger whose task's are ``base`` and that gives ``own`` (in
    ``unit``), as ``trigger()`` makes them: the package's ``options.trigger_options`` (each
    option given replaces the task's, ``max_wait`` is never below ``wait``)."""
    options = trigger_options(keywords(_in_seconds(own, unit)), lambda: base)
    return base if options is None else options


def rules_options(model: Any, own: Mapping[str, Any]) -> dict[str, Any]:
    """``own`` (in the rules' unit) as ``model`` (a ``KeyModel``) resolves it: every option
    named, the task's for those left out (``KeyModel.options``, whose answer is in the order
    of its parameters), to give ``KeyModel.trigger`` and ``KeyModel.fold`` by keyword."""
    _in_seconds(own, 1)  # only options of a call
    names = list(inspect.signature(model.options).parameters)
    return dict(zip(names, model.options(**{name: own.get(name) for name in names}), strict=True))


def keywords(own: Mapping[str, Any]) -> dict[str, Any]:
    """``own`` as ``trigger()``'s keywords (``{"debounce_wait": 0}``)."""
    _in_seconds(own, 1)
    return {f"debounce_{name}": value for name, value in own.items()}


def bad_calls() -> list[tuple[dict[str, Any], str]]:
    """Every option with every bad value of its kind: ``(trigger()'s keywords, a word of the
    error it raises)``."""
    return [
        (keywords({option.name: value}), text)
        for option in PER_CALL
        for value, text in option.kind.bad
    ]


def other_value(base: FlightOptions, option: CallOption) -> Any:
    """The largest sample value (seconds) of ``option`` that gives a trigger flight options
    other than ``base``'s."""
    for value in reversed(option.samples()):
        if resolve(base, {option.name: value}) != base:
            return value
    raise AssertionError(f"no sample of {option.name} changes {base}")


__all__ = [
    "NAMES",
    "PER_CALL",
    "CallOption",
    "Kind",
    "bad_calls",
    "call_options",
    "declared",
    "keywords",
    "other_value",
    "resolve",
    "rules_options",
]
