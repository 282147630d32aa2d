"""The options a trigger call gives for itself as ``tests/support/call_options.py`` reads
them from the package (``PER_CALL``, from ``options.TRIGGER_OPTIONS``), against every other
place of the package that names them, so that a per-call option the adapter misses (or one
it reads that the package does not take) fails here, before a property test silently leaves
it out; and the strategy the property tests draw them from. No server."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from hypothesis import find, settings

from django_debounce import debounced_task
from django_debounce.machine import US, KeyModel
from django_debounce.state import FlightOptions
from tests.support.call_options import (
    NAMES,
    PER_CALL,
    bad_calls,
    call_options,
    keywords,
    resolve,
)

FIND = settings(database=None, derandomize=True)


def parameters(function: object) -> tuple[str, ...]:
    return tuple(name for name in inspect.signature(function).parameters if name != "self")


def test_the_table_names_the_options_trigger_takes() -> None:
    """The per-call options of the package's table (``options.TRIGGER_OPTIONS``, read by
    ``declared()``) are the parameters of the rules' ``KeyModel.options`` and fields of
    ``FlightOptions``."""
    assert PER_CALL, "no per-call option found: declared() no longer reads the package"
    assert set(parameters(KeyModel.options)) == set(NAMES)
    fields = {f.name for f in dataclasses.fields(FlightOptions)}
    assert set(NAMES) <= fields
    assert len(set(NAMES)) == len(NAMES)


@pytest.mark.parametrize("option", PER_CALL, ids=NAMES)
def test_a_body_may_not_take_an_option_of_the_call(option) -> None:
    namespace: dict[str, object] = {}
    exec(f"def body(tag, {option.keyword}=None):\n    return None", namespace)
    with pytest.raises(TypeError, match="reserved"):
        debounced_task(name=f"tests.unit.reserved_{option.name}")(namespace["body"])


@pytest.mark.parametrize("option", PER_CALL, ids=NAMES)
def test_each_option_is_drawn_and_reaches_the_flight_options(option) -> None:
    """The property tests' strategy draws every option of the table (alone and with the
    others), and ``resolve`` gives it to the store as ``trigger()`` does."""
    alone = find(call_options(unit=US), lambda own: set(own) == {option.name}, settings=FIND)
    assert find(call_options(), lambda own: len(own) == len(PER_CALL), settings=FIND)
    assert find(call_options(), lambda own: own == {}, settings=FIND) == {}
    base = FlightOptions(wait=2.0, lease=10.0)
    made = [resolve(base, {option.name: value}) for value in option.samples()]
    assert all(isinstance(m, FlightOptions) for m in made)
    assert any(getattr(m, option.name) != getattr(base, option.name) for m in made)
    assert resolve(base, {}) is base
    assert set(keywords(alone)) == {option.keyword}
    assert [kw for kw, _text in bad_calls() if option.keyword in kw]
