"""Conformance with lodash's ``debounce`` and ``throttle``, case by case (issue 15).

Source: lodash 4.17.21 (git tag ``4.17.21``, commit f299b52f39486275a9e6483b60a410e06520c538
of github.com/lodash/lodash), ``test/test.js``: QUnit modules ``lodash.debounce`` (lines
4187-4484, 12 cases), ``lodash.throttle`` (22768-23036, 12 cases) and ``lodash.debounce and
lodash.throttle`` (23038-23236, 9 cases run for each of the two functions: 18). Each test is
named after its QUnit case. It plays the case's calls as triggers of one key on each store
(the ``store`` fixture), with the store clock given (``now=``; 1 lodash ms = 1 ms of the fake
clock), a pump that takes the key's due index entries as soon as they are due, and a worker
that takes each message when it arrives (``tests/support/lodash.py``), once per pump interval of
``INTERVALS`` (flights in the due index, or published at once with a countdown), and on a
line-for-line transcription of lodash's ``debounce`` on the same fake clock, then asserts the
case's own assertions on both, and that the store's runs (times and payloads) and everything
the case can observe after each step are lodash's. The ``@pytest.mark.worker`` tests at the
end play six of these cases again (four of lodash's, the two worked examples of issue 15) in
real time on a real worker, 1 lodash ms = 50 ms.

How a case maps onto a Celery task: a call is a trigger of the key, with the call's argument
as payload; ``func`` running is a run (lodash runs it inside the call on a leading edge, in a
call that finds ``maxWait`` reached, and in ``flush()``: here the worker claims such a flight
at once); ``cancel()``/``flush()`` are the task's. Where a case reads the return value of the
debounced function only to see which call ran ``func`` (``func`` is ``identity``, or returns
its call count), it asserts the payload of the latest run, or the run count, instead.

Played as they are: 35 of the 42 (``lodash.debounce``: 11 of 12; ``lodash.throttle``: all
12; for each of the two functions: ``supports recursive calls``, ``should work if the system
time is set backwards``, ``should support cancelling delayed calls``, ``should reset
`lastCalled` after cancelling``, ``should support flushing delayed calls``, ``should noop
`cancel` and `flush` when nothing is queued``). Three of them mock lodash's clock, which a
store does not have (its clock is the server's): ``should clear timeout when `func` is
called`` (``Infinity`` at the fifth read, which never comes) and ``should work if the system
time is set backwards`` (the step comes after the case's assertion) are played for their
calls; ``should work with a system time of `0``` reads 0 for its three calls, played at one
instant of the store clock.

Differ on purpose (3; README, section "Semantics", "Where this differs from lodash"),
asserted as documented, and played for the part they share with lodash:

- ``lodash.debounce``'s ``should support a `trailing` option``: its ``trailing: true`` half is
  lodash's; its ``leading: false, trailing: false`` half is refused at declaration (it would
  never run anything);
- ``should use a default `wait` of `0``` (x2): without ``wait`` a task waits
  ``DEBOUNCE_DEFAULT_WAIT`` (30 s); with ``wait=0`` the case holds as lodash's.

Not applicable (4), with the reason:

- ``should not error for non-object `options` values`` (x2): options are keyword arguments
  of ``debounced_task`` (an unknown one is a ``TypeError``); there is no options object;
- ``should invoke `func` with the correct `this` binding`` (x2): a Celery task body has no
  ``this``; the ``this`` half of ``should invoke the trailing call with the correct arguments
  and `this` binding`` is left out too (its arguments half is asserted).

Beyond lodash's suite: the worked examples of issue 15 (a throttle's follow-up, a bounded
debounce's runs) and the deliberate differences that lodash's cases do not reach (a trigger
that joins a leading run no worker has claimed yet; cancel before the claim; a live run that
a follow-up waits for). ``test_the_transcription_is_lodash_itself`` plays every script on
lodash 4.17.21 itself (node) when ``DEBOUNCE_LODASH_JS`` names its ``lodash.js``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_debounce import conf, debounced_task
from django_debounce.backends import get_backend
from django_debounce.keys import dumps
from django_debounce.state import Finish, FlightOptions
from tests.support.helpers import stays, wait_for
from tests.support.lodash import (
    TASK,
    Options,
    Player,
    Step,
    Trace,
    calls,
    debounce,
    dt,
    lodash,
    throttle,
    us_of,
)
from tests.testapp.models import RunLog

pytestmark = pytest.mark.django_db(transaction=True)

MISSING = object()


@dataclass(frozen=True)
class Look:
    """A case's assertion after a step: the run count (``count``, or at least ``least``), the
    argument of the latest run (``last``), or values it must not be (``last_not``)."""

    count: int | None = None
    least: int | None = None
    last: Any = MISSING
    last_not: tuple[Any, ...] = ()

    def check(self, seen: tuple[int, Any], where: str) -> None:
        count, last = seen
        if self.count is not None:
            assert count == self.count, f"{where}: {count} runs, the case says {self.count}"
        if self.least is not None:
            assert count >= self.least, f"{where}: {count} runs, the case says >= {self.least}"
        if self.last is not MISSING:
            assert last == self.last, f"{where}: latest run got {last!r}, not {self.last!r}"
        assert last not in self.last_not, f"{where}: latest run got {last!r}"


@dataclass(frozen=True)
class Case:
    """One debounced function of a QUnit case: its options, its script (``look`` steps carry
    the case's assertions), and the arguments of its recursive calls (``then``)."""

    name: str
    options: Options
    steps: Sequence[Step]
    then: Sequence[Any] = field(default_factory=tuple)


CASES: dict[str, Case] = {}


def case(name: str, options: Options, steps: Sequence[Step], then: Sequence[Any] = ()) -> Case:
    assert name not in CASES, name
    CASES[name] = found = Case(name, options, list(steps), tuple(then))
    return found


def look(t: float, **expected: Any) -> Step:
    return (t, "look", Look(**expected))


def t0() -> int:
    """The fake clock's origin: the real time (Redis TTLs stay sane), whole milliseconds."""
    return time.time_ns() // 1_000_000 * 1000


def check_looks(c: Case, trace: Trace, side: str) -> None:
    for index, ((t, op, arg), seen) in enumerate(zip(c.steps, trace.seen, strict=True)):
        if op == "look" and isinstance(arg, Look):
            arg.check(seen, f"{c.name} ({side}), step {index} at {t} ms")


# Pump intervals each case is played with (DEBOUNCE_PUMP_INTERVAL, seconds; 1 lodash ms =
# 1 ms): 0, every flight not due at once waits in the due index and the pump publishes it;
# 0.05, flights due within 50 ms go out at once with a countdown, later ones wait in the
# index; 1 (the default), every flight of these cases goes out at once with a countdown.
INTERVALS = (0.0, 0.05, 1.0)


def play(c: Case, *, interval: float = 1.0, **player: Any) -> tuple[Trace, Player]:
    """``c`` on the store under test with the pump interval ``interval``: its trace, and the
    player (its runs, results)."""
    with override_settings(DEBOUNCE_PUMP_INTERVAL=interval):
        name = f"{c.name} [{interval}]"
        p = Player(get_backend(), c.options, name=name, t0=t0(), then=c.then, **player)
        return p.play(c.steps), p


def conform(c: Case) -> Player:
    """``c`` on lodash and on the store (once per pump interval of ``INTERVALS``): the case's
    assertions hold on both, and the store runs when lodash runs ``func``, with the same
    argument, observed the same after every step. Returns the player of the default
    interval."""
    want = lodash(c.options, c.steps, then=c.then)
    check_looks(c, want, "lodash")
    player = None
    for interval in INTERVALS:
        got, player = play(c, interval=interval)
        where = f"{c.name}, pump interval {interval} s"
        check_looks(c, got, f"store, pump interval {interval} s")
        assert got.runs == want.runs, f"{where}: runs (ms, arg) {got.runs}, lodash {want.runs}"
        assert got.seen == want.seen, f"{where}: seen {got.seen}, lodash {want.seen}"
    assert player is not None
    return player


# == QUnit module lodash.debounce =============================================================

SHOULD_DEBOUNCE = case(
    "debounce: should debounce a function",
    debounce(32),
    [
        (0, "call", "a"),
        (0, "call", "b"),
        (0, "call", "c"),
        look(0, count=0),
        look(128, count=1),
        (128, "call", "d"),
        (128, "call", "e"),
        (128, "call", "f"),
        look(128, count=1, last="c"),  # results ['c', 'c', 'c']
        look(256, count=2),
    ],
)


def test_debounce_should_debounce_a_function(store):
    player = conform(SHOULD_DEBOUNCE)
    assert [(r.at, r.arg, r.triggers) for r in player.runs] == [(32, "c", 3), (160, "f", 3)]


SUBSEQUENT = case(
    "debounce: subsequent debounced calls return the last `func` result",
    debounce(32),
    [
        (0, "call", "a"),
        (64, "call", "b"),
        look(64, last_not=("b",)),  # notEqual(debounced('b'), 'b'): b did not run in the call
        (128, "call", "c"),
        look(128, last_not=("c",)),
    ],
)


def test_debounce_subsequent_debounced_calls_return_the_last_func_result(store):
    conform(SUBSEQUENT)


WAIT_ZERO = case(
    "debounce: should not immediately call `func` when `wait` is `0`",
    debounce(0),
    [(0, "call", None), (0, "call", None), look(0, count=0), look(5, count=1)],
)


def test_debounce_should_not_immediately_call_func_when_wait_is_0(store):
    player = conform(WAIT_ZERO)
    assert player.runs[0].triggers == 2


DEFAULT_OPTIONS = case(
    "debounce: should apply default options",
    debounce(32),  # {}
    [(0, "call", None), look(0, count=0), look(64, count=1)],
)


def test_debounce_should_apply_default_options(store):
    conform(DEFAULT_OPTIONS)


WITH_LEADING = case(
    "debounce: should support a `leading` option (withLeading)",
    debounce(32, leading=True),
    [(0, "call", None), look(0, count=1), look(64, count=1), (64, "call", None), look(64, count=2)],
)
WITH_LEADING_AND_TRAILING = case(
    "debounce: should support a `leading` option (withLeadingAndTrailing)",
    debounce(32, leading=True),
    [(0, "call", None), (0, "call", None), look(0, count=1), look(64, count=2)],
)


def test_debounce_should_support_a_leading_option(store):
    conform(WITH_LEADING)
    player = conform(WITH_LEADING_AND_TRAILING)
    assert [r.at for r in player.runs] == [0, 32]


LEADING_RESULTS = case(
    "debounce: subsequent leading debounced calls return the last `func` result",
    debounce(32, leading=True, trailing=False),
    [
        (0, "call", "a"),
        look(0, last="a"),
        (0, "call", "b"),
        look(0, last="a"),  # results ['a', 'a']
        (64, "call", "c"),
        look(64, last="c"),
        (64, "call", "d"),
        look(64, last="c"),  # results ['c', 'c']
    ],
)


def test_debounce_subsequent_leading_debounced_calls_return_the_last_func_result(store):
    player = conform(LEADING_RESULTS)
    live = get_backend().live_state(player.key_hash)
    assert (live["triggers"], live["runs"], live["cancelled"]) == (4, 2, 2)  # b, d dropped


WITH_TRAILING = case(
    "debounce: should support a `trailing` option (withTrailing)",
    debounce(32, trailing=True),
    [(0, "call", None), look(0, count=0), look(64, count=1)],
)


def test_debounce_should_support_a_trailing_option(store):
    conform(WITH_TRAILING)
    # withoutTrailing, {trailing: false} (leading defaults to false): lodash accepts it and
    # never calls func (withoutCount stays 0). Deliberate difference, README "Semantics",
    # "Where this differs from lodash": refused at declaration, since it would never run.
    without = debounce(32, trailing=False)
    assert lodash(without, [(0, "call", None), look(64, count=0)]).runs == []
    with pytest.raises(ImproperlyConfigured, match="never run"):
        debounced_task(wait=0.032, trailing=False)(lambda: None)


MAX_WAIT = case(
    "debounce: should support a `maxWait` option",
    debounce(32, maxWait=64),
    [
        (0, "call", None),
        (0, "call", None),
        look(0, count=0),
        look(128, count=1),
        (128, "call", None),
        (128, "call", None),
        look(128, count=1),
        look(256, count=2),
    ],
)


def test_debounce_should_support_a_max_wait_option(store):
    conform(MAX_WAIT)


# A tight loop: `while ((new Date - start) < limit)` calls both for 320 ms; a call every ms.
TIGHT_WITH = case(
    "debounce: should support `maxWait` in a tight loop (withMaxWait)",
    debounce(64, maxWait=128),
    [*calls(0, 319, 1), look(319, least=1)],  # Boolean(withCount) is true
)
TIGHT_WITHOUT = case(
    "debounce: should support `maxWait` in a tight loop (withoutMaxWait)",
    debounce(96),
    [*calls(0, 319, 1), look(319, count=0)],  # Boolean(withoutCount) is false
)


def test_debounce_should_support_max_wait_in_a_tight_loop(store):
    player = conform(TIGHT_WITH)
    # maxWait counts from the last run while the stream goes on (lodash's lastInvokeTime):
    # 128, 256, then the trailing run 64 ms after the last call (from the flight's first
    # trigger, 129 and 257, it would be 257 and 383)
    assert [r.at for r in player.runs] == [128, 256, 383]
    assert [r.at for r in conform(TIGHT_WITHOUT).runs] == [319 + 96]


QUEUE_TRAILING = case(
    "debounce: should queue a trailing call for subsequent debounced calls after `maxWait`",
    debounce(200, maxWait=200),
    [(0, "call", None), (190, "call", None), (200, "call", None), (210, "call", None)]
    + [look(500, count=2)],
)


def test_debounce_should_queue_a_trailing_call_after_max_wait(store):
    player = conform(QUEUE_TRAILING)
    assert [r.at for r in player.runs] == [200, 400]


MAX_DELAYED = case(
    "debounce: should cancel `maxDelayed` when `delayed` is invoked",
    debounce(32, maxWait=64),
    [(0, "call", None), (128, "call", None), look(128, count=1), look(192, count=2)],
)


def test_debounce_should_cancel_max_delayed_when_delayed_is_invoked(store):
    player = conform(MAX_DELAYED)
    assert [r.at for r in player.runs] == [32, 160]


TRAILING_ARGS = case(
    "debounce: should invoke the trailing call with the correct arguments and `this` binding",
    debounce(32, leading=True, maxWait=64),
    # while (true) { if (!debounced.call(object, 'a')) break; }: func returns false on its
    # second run, so the loop calls until func has run twice
    [(0, "until", (2, "a", 1)), look(128, count=2, last="a")],
)


def test_debounce_should_invoke_the_trailing_call_with_the_correct_arguments(store):
    player = conform(TRAILING_ARGS)
    assert [r.at for r in player.runs] == [0, 64]  # maxWait from the leading run


# == QUnit module lodash.throttle =============================================================

SHOULD_THROTTLE = case(
    "throttle: should throttle a function",
    throttle(32),
    [
        (0, "call", None),
        (0, "call", None),
        (0, "call", None),
        look(0, least=1),  # ok(callCount); lastCount = callCount (1)
        look(64, least=2),  # callCount > lastCount
    ],
)


def test_throttle_should_throttle_a_function(store):
    player = conform(SHOULD_THROTTLE)
    assert [(r.at, r.triggers) for r in player.runs] == [(0, 1), (32, 2)]


FIRST_RESULT = case(
    "throttle: subsequent calls should return the result of the first call",
    throttle(32),
    [
        (0, "call", "a"),
        look(0, last="a"),
        (0, "call", "b"),
        look(0, last="a"),  # results ['a', 'a']
        (64, "call", "c"),
        look(64, last_not=("a", None)),
        (64, "call", "d"),
        look(64, last_not=("d", None)),
    ],
)


def test_throttle_subsequent_calls_should_return_the_result_of_the_first_call(store):
    conform(FIRST_RESULT)


CLEAR_TIMEOUT = case(
    "throttle: should clear timeout when `func` is called",
    throttle(32),  # lodash's Date.now is mocked to Infinity at its fifth read: never read
    [(0, "call", None), (0, "call", None), look(64, count=2)],
)


def test_throttle_should_clear_timeout_when_func_is_called(store):
    conform(CLEAR_TIMEOUT)


INVOKED_ONCE = case(
    "throttle: should not trigger a trailing call when invoked once",
    throttle(32),
    [(0, "call", None), look(0, count=1), look(64, count=1)],
)


def test_throttle_should_not_trigger_a_trailing_call_when_invoked_once(store):
    conform(INVOKED_ONCE)


REPEATEDLY = case(
    "throttle: should trigger a call when invoked repeatedly",
    throttle(32),
    [*calls(0, 319, 1), look(319, least=2)],  # callCount > 1 when the loop ends
)
REPEATEDLY_NOT_LEADING = case(
    "throttle: should trigger a call when invoked repeatedly and `leading` is `false`",
    throttle(32, leading=False),
    [*calls(0, 319, 1), look(319, least=2)],
)


def test_throttle_should_trigger_a_call_when_invoked_repeatedly(store):
    player = conform(REPEATEDLY)
    assert [r.at for r in player.runs] == [0, *range(32, 321, 32)]  # one per 32 ms


def test_throttle_should_trigger_a_call_when_invoked_repeatedly_and_leading_is_false(store):
    player = conform(REPEATEDLY_NOT_LEADING)
    assert [r.at for r in player.runs] == [*range(32, 321, 32)]


SECOND_ASAP = case(
    "throttle: should trigger a second throttled call as soon as possible",
    throttle(128, leading=False),
    [(0, "call", None), look(192, count=1), (192, "call", None), look(254, count=1)]
    + [look(384, count=2)],
)


def test_throttle_should_trigger_a_second_throttled_call_as_soon_as_possible(store):
    player = conform(SECOND_ASAP)
    assert [r.at for r in player.runs] == [128, 320]


THROTTLE_DEFAULTS = case(
    "throttle: should apply default options",
    throttle(32),  # {}
    [(0, "call", None), (0, "call", None), look(0, count=1), look(128, count=2)],
)


def test_throttle_should_apply_default_options(store):
    conform(THROTTLE_DEFAULTS)


THROTTLE_LEADING = case(
    "throttle: should support a `leading` option (withLeading)",
    throttle(32, leading=True),
    [(0, "call", "a"), look(0, last="a")],  # withLeading('a') === 'a': ran in the call
)
THROTTLE_NOT_LEADING = case(
    "throttle: should support a `leading` option (withoutLeading)",
    throttle(32, leading=False),
    [(0, "call", "a"), look(0, last=None)],  # withoutLeading('a') === undefined
)


def test_throttle_should_support_a_leading_option(store):
    conform(THROTTLE_LEADING)
    conform(THROTTLE_NOT_LEADING)


THROTTLE_TRAILING = case(
    "throttle: should support a `trailing` option (withTrailing)",
    throttle(64, trailing=True),
    [(0, "call", "a"), look(0, last="a"), (0, "call", "b"), look(0, last="a")]
    + [look(256, count=2)],
)
THROTTLE_NOT_TRAILING = case(
    "throttle: should support a `trailing` option (withoutTrailing)",
    throttle(64, trailing=False),
    [(0, "call", "a"), look(0, last="a"), (0, "call", "b"), look(0, last="a")]
    + [look(256, count=1)],
)


def test_throttle_should_support_a_trailing_option(store):
    assert [r.arg for r in conform(THROTTLE_TRAILING).runs] == ["a", "b"]
    conform(THROTTLE_NOT_TRAILING)


LAST_CALLED = case(
    "throttle: should not update `lastCalled`, at the end of the timeout, when `trailing` is "
    "`false`",
    throttle(64, trailing=False),
    [(0, "call", None), (0, "call", None), (96, "call", None), (96, "call", None)]
    + [look(192, least=2)],
)


def test_throttle_should_not_update_last_called_when_trailing_is_false(store):
    player = conform(LAST_CALLED)
    assert [r.at for r in player.runs] == [0, 96]


SYSTEM_TIME_ZERO = case(
    "throttle: should work with a system time of `0`",
    throttle(32),  # lodash's Date.now is mocked to 0 for three reads: the calls at one instant
    [
        (0, "call", "a"),
        look(0, last="a"),
        (0, "call", "b"),
        look(0, last="a"),
        (0, "call", "c"),
        look(0, count=1, last="a"),  # results ['a', 'a', 'a'], callCount 1
        look(64, count=2),
    ],
)


def test_throttle_should_work_with_a_system_time_of_0(store):
    conform(SYSTEM_TIME_ZERO)


# == QUnit module lodash.debounce and lodash.throttle (each case for both) ====================

FUNCS = {"debounce": debounce, "throttle": throttle}


def both(name: str, steps_of: Any, then: Sequence[Any] = (), **options: Any) -> dict[str, Case]:
    """The case ``name`` for ``_.debounce`` and ``_.throttle``: ``steps_of(is_debounce)``."""
    return {
        method: case(f"{method}: {name}", make(**options), steps_of(method == "debounce"), then)
        for method, make in FUNCS.items()
    }


DEFAULT_WAIT_ZERO = both(
    "should use a default `wait` of `0`",
    lambda is_debounce: [
        (0, "call", None),
        (32, "call", None),
        look(32, count=1 if is_debounce else 2),
    ],
    wait=0,
)


def _no_wait() -> None:
    """A task body declared without ``wait``."""


NO_WAIT = debounced_task(name="testapp.lodash_no_wait")(_no_wait)


@pytest.mark.parametrize("method", FUNCS)
def test_should_use_a_default_wait_of_0(store, method):
    conform(DEFAULT_WAIT_ZERO[method])  # with wait=0 given, as lodash's default
    # Deliberate difference, README "Semantics", "Where this differs from lodash": a task
    # declared without wait waits DEBOUNCE_DEFAULT_WAIT (30 s by default), not 0: in a task
    # queue a default of "at once" would make every trigger a run.
    assert conf.DEFAULTS["DEFAULT_WAIT"] == 30
    with override_settings(DEBOUNCE_DEFAULT_WAIT=30):
        assert NO_WAIT.wait == 30
    waits = DEFAULT_WAIT_ZERO[method]
    slow = Case(waits.name + " (30 s)", FUNCS[method](30_000), waits.steps)
    got, _player = play(slow)
    assert got.seen[-1][0] == (0 if method == "debounce" else 1)  # lodash: 1 / 2


RECURSIVE = both(
    "supports recursive calls",
    lambda is_debounce: [
        (0, "call", "a"),
        look(0, count=0 if is_debounce else 1),  # expected.slice(0, isDebounce ? 0 : 1)
        look(256, count=3, last="c"),  # every call made, in order
    ],
    then=("b", "c"),
    wait=32,
)


@pytest.mark.parametrize("method", FUNCS)
def test_supports_recursive_calls(store, method):
    # The run calls the debounced function again (a task body triggering its own key while
    # its run is live); the follow-up runs after the live run, as lodash's nested call does.
    player = conform(RECURSIVE[method])
    expected = [32, 64, 96] if method == "debounce" else [0, 32, 32]
    assert [(r.at, r.arg) for r in player.runs] == list(zip(expected, "abc", strict=True))


BACKWARDS = both(
    "should work if the system time is set backwards",
    lambda is_debounce: [
        (0, "call", None),
        (64, "call", None),
        look(64, count=1 if is_debounce else 2),
    ],
    wait=32,
)


@pytest.mark.parametrize("method", FUNCS)
def test_should_work_if_the_system_time_is_set_backwards(store, method):
    # lodash's clock steps back at its fourth read, after the case's assertion (at 96 ms):
    # what is asserted is the two calls' outcome.
    conform(BACKWARDS[method])


CANCEL_DELAYED = both(
    "should support cancelling delayed calls",
    lambda is_debounce: [(0, "call", None), (0, "cancel", None), look(64, count=0)],
    wait=32,
    leading=False,
)


@pytest.mark.parametrize("method", FUNCS)
def test_should_support_cancelling_delayed_calls(store, method):
    player = conform(CANCEL_DELAYED[method])
    assert player.cancelled == [1]


RESET_AFTER_CANCEL = both(
    "should reset `lastCalled` after cancelling",
    lambda is_debounce: [
        (0, "call", None),
        look(0, count=1),  # funced() === 1
        (0, "cancel", None),
        (0, "call", None),
        look(0, count=2),  # funced() === 2: the edge was reset, it runs in the call
        (0, "call", None),
        look(64, count=3),
    ],
    wait=32,
    leading=True,
)


@pytest.mark.parametrize("method", FUNCS)
def test_should_reset_last_called_after_cancelling(store, method):
    # cancel() resets the edge whatever the flight's state: here nothing is pending (the
    # leading run was claimed), cancel() returns 0, and the next trigger leads at once.
    player = conform(RESET_AFTER_CANCEL[method])
    assert player.cancelled == [0]
    assert [r.at for r in player.runs] == [0, 0, 32]


FLUSH_DELAYED = both(
    "should support flushing delayed calls",
    lambda is_debounce: [
        (0, "call", None),
        (0, "flush", None),
        look(0, count=1),  # funced.flush() === 1: ran in the flush
        look(64, count=1),
    ],
    wait=32,
    leading=False,
)


@pytest.mark.parametrize("method", FUNCS)
def test_should_support_flushing_delayed_calls(store, method):
    player = conform(FLUSH_DELAYED[method])
    assert player.flushed == [True]


NOOP = both(
    "should noop `cancel` and `flush` when nothing is queued",
    lambda is_debounce: [
        (0, "cancel", None),
        (0, "flush", None),
        look(0, count=0, last=None),  # funced.flush() === undefined
        look(64, count=0),
    ],
    wait=32,
)


@pytest.mark.parametrize("method", FUNCS)
def test_should_noop_cancel_and_flush_when_nothing_is_queued(store, method):
    player = conform(NOOP[method])
    assert (player.cancelled, player.flushed) == ([0], [False])


# == issue 15's worked examples ===============================================================

THROTTLE_FOLLOW_UP = case(
    "issue 15: a throttle's follow-up runs wait after the run, not after the trigger",
    throttle(320),
    [(0, "call", None), look(0, count=1), (300, "call", None), look(300, count=1)]
    + [look(640, count=2)],
)


def test_a_throttle_runs_its_follow_up_wait_after_the_last_run(store):
    player = conform(THROTTLE_FOLLOW_UP)
    assert [r.at for r in player.runs] == [0, 320]  # from the trigger at 300 it was 620


BOUNDED_STREAM = case(
    "issue 15: a bounded debounce under a stream runs max_wait after each run",
    debounce(320, maxWait=640),
    calls(0, 2000, 100),
)


def test_a_bounded_debounce_runs_max_wait_after_each_run_during_a_stream(store):
    player = conform(BOUNDED_STREAM)
    assert [r.at for r in player.runs] == [640, 1280, 1920, 2320]
    assert [r.triggers for r in player.runs] == [7, 6, 7, 1]


# == where this differs from lodash on purpose (README "Semantics") ============================

JOIN_UNCLAIMED = case(
    "difference: a trigger joins a leading run no worker has claimed yet",
    debounce(32, leading=True),
    [(0, "call", "a"), (1, "call", "b")],
)
CANCEL_UNCLAIMED = case(
    "difference: cancel before the claim",
    debounce(32, leading=True),
    [(0, "call", "a"), (1, "cancel", None), (2, "call", "b")],
)
CANCEL_LIVE = case(
    "difference: cancel while a run is live",
    throttle(32),
    [(0, "call", "a"), (5, "cancel", None), (6, "call", "b")],
)
THROTTLE_LIVE = case(
    "difference: a throttle's follow-ups and a live run",
    throttle(300),
    [(0, "call", "a"), (50, "call", "b"), (400, "call", "c")],
)


def test_a_trigger_before_the_claim_joins_the_leading_run(store):
    # README "Semantics", "Where this differs from lodash": a trigger that arrives before a
    # worker has claimed the leading run joins it (lodash ran func inside the first call,
    # so its second call makes a trailing run). Worker latency 5 ms.
    c = JOIN_UNCLAIMED
    assert lodash(c.options, c.steps).runs == [(0, "a"), (33, "b")]
    got, player = play(c, latency=5)
    assert [(r.at, r.arg, r.triggers) for r in player.runs] == [(5, "b", 2)]
    assert got.runs == [(5, "b")]


def test_cancel_before_the_claim_drops_the_leading_run(store):
    # README "Semantics", "Where this differs from lodash": cancel() drops a flight that no
    # worker has claimed, the leading one included (the leading run happens at the claim;
    # an operator's cancel must be able to stop work that has not started). lodash's leading
    # call ran inside the call. The edge is reset either way: the next trigger leads.
    c = CANCEL_UNCLAIMED
    assert lodash(c.options, c.steps).runs == [(0, "a"), (2, "b")]
    _got, player = play(c, latency=5)
    assert player.cancelled == [1]
    assert [(r.at, r.arg) for r in player.runs] == [(7, "b")]


def test_cancel_while_a_run_is_live_resets_the_edge_and_the_next_run_waits_for_it(store):
    # cancel() returns 0 and resets the edge while a run is live: the next trigger is a
    # leading edge (due at once), and it runs when the live run ends (no overlap, I2);
    # lodash, whose func returns before the next call, runs it inside the call.
    c = CANCEL_LIVE
    assert lodash(c.options, c.steps).runs == [(0, "a"), (6, "b")]
    _got, player = play(c, body=20)
    assert player.cancelled == [0]
    assert player.ms(us_of(player.results[1].due_at)) == 6  # a leading edge: due at once
    assert [(r.at, r.arg) for r in player.runs] == [(0, "a"), (20, "b")]


def test_a_throttle_follow_up_waits_for_the_live_run(store):
    # README "Semantics", the throttle row: a save during a live run runs at its flight's due
    # time or when the live run ends, whichever is later; two starts can be closer than W,
    # as in lodash: triggers at 0, 50 and 400 ms, W = 300 ms, runs of 200 ms.
    c = THROTTLE_LIVE
    assert lodash(c.options, c.steps).runs == [(0, "a"), (300, "b"), (400, "c")]
    _got, player = play(c, body=200)
    # c is a leading edge (350 ms after b) due at 400, and waits for b's run (300-500)
    assert [(r.at, r.arg) for r in player.runs] == [(0, "a"), (300, "b"), (500, "c")]


# == the store's hot paths use the anchor too ==================================================


def test_the_hot_paths_count_max_wait_from_the_anchor(store):
    # A merged trigger on the hot path (Redis: the top of trigger.lua; PostgreSQL: the
    # one-statement merge, _MERGE_SQL) takes the store's own clock. The flight before it
    # is set up on the fake clock, 4 s in the past: its anchor is a run's claim, earlier
    # than its first trigger, and the merged trigger's due time is anchor + max_wait.
    backend = get_backend()
    base = time.time_ns() // 1000 - 4_000_000
    key_hash = "a" * 64
    options = FlightOptions(wait=2.0, max_wait=2.5, lease=60)

    def trigger(at_ms: float | None) -> Any:
        return backend.trigger(
            task_name=TASK,
            key="hot",
            key_hash=key_hash,
            payload_json=dumps([at_ms]),
            options=options,
            now=None if at_ms is None else dt(base + round(at_ms * 1000)),
        )

    trigger(0)
    trigger(1500)
    trigger(2400)  # due min(2400 + 2000, 0 + 2500) = 2500
    claim = backend.fire(
        key_hash, None, task_name=TASK, options=options, now=dt(base + 2_500_000)
    ).claim
    assert claim is not None and claim.triggers == 3
    backend.finish(
        key_hash,
        claim.run_id,
        Finish(ok=True),
        task_name=TASK,
        options=options,
        now=dt(base + 2_500_000),
    )
    opened, dispatch = trigger(2600)  # continues the stream: anchored at the claim (2500)
    assert dispatch is None  # due in 2 s: it waits in the due index
    assert us_of(opened.due_at) == base + 4_600_000
    merged, dispatch = trigger(None)  # now: about base + 4000 ms, the hot path
    assert dispatch is None and not merged.scheduled
    assert us_of(merged.due_at) == base + 5_000_000  # 2500 + 2500, not 2600 + 2500


# == in real time, on a real worker: 1 lodash ms = 50 ms =======================================

MS = 0.05  # seconds per lodash millisecond (tests.testapp.tasks.LODASH_MS)
TOL = max(0.1, 0.1 * 32 * MS)  # max(100 ms, a tenth of wait), on a quiet machine
# The measured latency of this test's worker: trigger to start of a run due at once, the most
# of two probes just before the case (``warm_worker``). A loaded machine is late everywhere
# (a leading run 0.28 s after its call at load 8): a case's times may be off by twice that
# latency more than TOL.
LATENCY = [0.0]


def starts(task: str, tag: str) -> list[RunLog]:
    return list(RunLog.objects.filter(task=task, tag=tag).order_by("started"))


def near(actual: float, expected: float, what: str) -> None:
    tolerance = TOL + 2 * LATENCY[0]
    assert abs(actual - expected) <= tolerance, (
        f"{what}: {actual - expected:+.3f} s off (tolerance {tolerance:.3f} s, "
        f"latency {LATENCY[0]:.3f} s)"
    )


def at(start: float, lodash_ms: float) -> None:
    """Sleep until ``lodash_ms`` after ``start``: the case's schedule (not a synchronisation)."""
    time.sleep(max(start + lodash_ms * MS - time.time(), 0))


def runs_of(task: str, tag: str, n: int, timeout: float = 30) -> list[RunLog]:
    return wait_for(
        lambda: r if len(r := starts(task, tag)) >= n else None,
        timeout=timeout,
        message=f"{n} runs of {task}",
    )


_warm: set[int] = set()


@pytest.fixture
def warm_worker(worker: Any, unique_tag: str) -> Any:
    """The worker, with every pool process past its first run (a process's first run opens
    its connections: a fifth of a second more, once per worker), and ``LATENCY`` measured."""
    from tests.testapp.tasks import coalesce

    if id(worker) not in _warm:
        tags = [f"{unique_tag}-warm-{i}" for i in range(worker.concurrency)]
        for tag in tags:
            coalesce.trigger(tag, 0.3)  # runs that overlap: one per pool process
        wait_for(
            lambda: (
                RunLog.objects.filter(tag__in=tags, finished__isnull=False).count() == len(tags)
            ),
            message="the warm-up runs",
        )
        _warm.add(id(worker))
    probes = []
    for i in range(2):
        tag = f"{unique_tag}-latency-{i}"
        before = time.time()
        coalesce.trigger(tag)  # wait=0: due at once
        probes.append(runs_of("testapp.coalesce", tag, 1)[0].started - before)
    LATENCY[0] = max(probes)
    return worker


@pytest.mark.worker
def test_real_time_debounce_should_support_a_leading_option(warm_worker, unique_tag):
    from tests.testapp.tasks import lodash_leading

    task = "testapp.lodash_leading"
    one, two = f"{unique_tag}-withLeading", f"{unique_tag}-withLeadingAndTrailing"
    start = time.time()
    lodash_leading.trigger(one)
    lodash_leading.trigger(two)
    # lodash runs func inside the first call; here the worker claims it: the second call
    # comes after that claim (before it, it would join the leading run: see README)
    lead = runs_of(task, two, 1)[0]
    near(lead.started, start, "the leading run")
    again = time.time()
    lodash_leading.trigger(two)
    trailing = runs_of(task, two, 2)[1]
    near(trailing.started, again + 32 * MS, "the trailing run, wait after the last call")
    at(start, 64)
    later = time.time()
    lodash_leading.trigger(one)  # quiet for wait: a leading edge again
    first, second = runs_of(task, one, 2)
    near(first.started, start, "withLeading's first run")
    near(second.started, later, "withLeading's second run, in the call")
    assert stays(lambda: len(starts(task, one)) + len(starts(task, two)) == 4, duration=1.8)


@pytest.mark.worker
def test_real_time_throttle_runs_its_follow_up_wait_after_the_last_run(warm_worker, unique_tag):
    from tests.testapp.tasks import lodash_throttle

    task = "testapp.lodash_throttle"
    lodash_throttle.trigger(unique_tag, "a")
    lead = runs_of(task, unique_tag, 1)[0]
    at(lead.started, 30)
    lodash_throttle.trigger(unique_tag, "b")  # 30 ms (1.5 s) after the leading run
    follow = runs_of(task, unique_tag, 2)[1]
    # lodash: 32 ms after the leading run (the flight's own first trigger would say 62)
    near(follow.started, lead.started + 32 * MS, "the follow-up")
    assert follow.payload == {"arg": "b"}


@pytest.mark.worker
def test_real_time_bounded_debounce_runs_max_wait_after_each_run(warm_worker, unique_tag):
    from tests.testapp.tasks import lodash_bounded

    task = "testapp.lodash_bounded"
    start = time.time()
    last = start
    for t in range(0, 141, 10):  # a call every 10 ms (0.5 s) for 140 ms
        at(start, t)
        lodash_bounded.trigger(unique_tag)
        last = time.time()
    one, two, three = runs_of(task, unique_tag, 3)
    near(one.started, start + 64 * MS, "maxWait from the first call")  # lodash: 64
    near(two.started, one.started + 64 * MS, "maxWait from the last run")  # lodash: 128
    near(three.started, last + 32 * MS, "the trailing run")  # lodash: 172
    assert sum(r.triggers for r in (one, two, three)) == 15
    assert stays(lambda: len(starts(task, unique_tag)) == 3, duration=1.0)


@pytest.mark.worker
def test_real_time_throttle_should_reset_last_called_after_cancelling(warm_worker, unique_tag):
    from tests.testapp.tasks import lodash_throttle

    task = "testapp.lodash_throttle"
    lodash_throttle.trigger(unique_tag, "a")
    runs_of(task, unique_tag, 1)
    assert lodash_throttle.cancel(unique_tag) == 0  # nothing pending: the edge still resets
    second_call = time.time()
    result = lodash_throttle.trigger(unique_tag, "b")
    near(result.due_at.timestamp(), second_call, "the call after cancel(): due at once")
    second = runs_of(task, unique_tag, 2)[1]
    near(second.started, second_call, "the call after cancel(): a leading edge")
    lodash_throttle.trigger(unique_tag, "c")
    third = runs_of(task, unique_tag, 3)[2]
    near(third.started, second.started + 32 * MS, "the trailing run, wait after the last run")
    assert [r.payload["arg"] for r in starts(task, unique_tag)] == ["a", "b", "c"]


@pytest.mark.worker
def test_real_time_throttle_supports_recursive_calls(warm_worker, store, unique_tag):
    from tests.testapp.tasks import lodash_recursive

    recursive = lodash_recursive[store]
    task = recursive.name
    recursive.trigger(unique_tag, "a", ["b", "c"])
    a, b, c = runs_of(task, unique_tag, 3)
    assert [r.payload["arg"] for r in (a, b, c)] == ["a", "b", "c"]
    # lodash: a at 0, b at 32 (trailing, wait after a), c inside b (a leading edge: the
    # previous call, made in a's run, is wait ago); here c runs right after b's run ends.
    # b's run calls c 2 lodash ms in (tests.testapp.tasks._recursive): lodash's c comes 0 ms
    # past the edge's boundary, which real latencies would put a few ms either side of.
    near(b.started, a.started + 32 * MS, "b")
    near(c.started, b.finished, "c, once b's run has ended")
    assert stays(lambda: len(starts(task, unique_tag)) == 3, duration=1.0)


@pytest.mark.worker
def test_real_time_debounce_should_support_flushing_delayed_calls(warm_worker, unique_tag):
    from tests.testapp.tasks import lodash_debounce

    task = "testapp.lodash_debounce"
    lodash_debounce.trigger(unique_tag)
    flushed = time.time()
    assert lodash_debounce.flush(unique_tag) is True
    (run,) = runs_of(task, unique_tag, 1)
    near(run.started, flushed, "the flushed run, at once")
    assert stays(lambda: len(starts(task, unique_tag)) == 1, duration=64 * MS)


def test_the_pump_never_sleeps_past_the_entry_it_waits_for():
    # Found by the real-time cases above (a trailing run up to 0.17 s late, tolerance 0.16 s):
    # the pump's jitter lengthened its sleep by up to 10%, so it woke after the entry it
    # slept for (up to 0.1 s late with the 1 s interval). The jitter only shortens it now.
    import threading

    from django_debounce.pump import Pump

    class Waits(threading.Event):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[float] = []

        def wait(self, timeout: float | None = None) -> bool:
            assert timeout is not None
            self.seen.append(timeout)
            if len(self.seen) == 200:
                self.set()
            return self.is_set()

    class Sleepy(Pump):
        def tick(self, *, recheck: bool = False) -> float:
            return 0.4  # the first entry is due in 0.4 s

    pump = Sleepy(tasks={})
    pump._stop = waits = Waits()
    pump.run()
    assert len(waits.seen) == 200
    assert max(waits.seen) <= 0.4  # never after the entry
    assert min(waits.seen) >= 0.36 and len(set(waits.seen)) > 1  # jittered, by 10% at most


# == the transcription against lodash itself ==================================================

NODE_DRIVER = r"""
const lodashPath = process.argv[1];
const cases = JSON.parse(require('fs').readFileSync(0, 'utf8'));
let clock = 0, order = 0, timers = [];
const setT = (fn, delay) => {
  timers.push([clock + Math.max(delay, 0), ++order, fn]);
  return order;
};
const clearT = (id) => { timers = timers.filter(t => t[1] !== id); };
const runBefore = (t) => {
  for (;;) {
    timers.sort((x, y) => x[0] - y[0] || x[1] - y[1]);
    if (!timers.length || timers[0][0] >= t) return;
    const [due, , fn] = timers.shift();
    clock = due; fn();
  }
};
global.window = undefined;
const root = require(lodashPath);
const _ = root.runInContext({Date: {now: () => clock}, setTimeout: setT, clearTimeout: clearT});
const out = {};
for (const c of cases) {
  clock = 0; order = 0; timers = [];
  const runs = [], seen = [], queue = c.then.slice();
  const o = c.options, opts = {leading: o.leading, trailing: o.trailing};
  if (o.max_wait !== null) opts.maxWait = o.max_wait;
  const f = _.debounce(function (v) {
    runs.push([clock, v]);
    if (queue.length) f(queue.shift());
    return v;
  }, o.wait, opts);
  for (const [t, op, arg] of c.steps) {
    runBefore(t); clock = t;
    if (op === 'call') f(arg);
    else if (op === 'cancel') f.cancel();
    else if (op === 'flush') f.flush();
    else if (op === 'until') {
      for (;;) {
        f(arg[1]);
        if (runs.length >= arg[0]) break;
        runBefore(clock + arg[2]);
        clock += arg[2];
      }
    }
    seen.push([runs.length, runs.length ? runs[runs.length - 1][1] : null]);
  }
  runBefore(Infinity);
  out[c.name] = {runs, seen};
}
process.stdout.write(JSON.stringify(out));
"""


def test_the_transcription_is_lodash_itself():
    """Every script of this module on lodash 4.17.21's own ``debounce`` (node, the same fake
    clock and event model) gives what ``tests.support.lodash.lodash`` gives. Opt-in: set
    ``DEBOUNCE_LODASH_JS`` to lodash 4.17.21's ``lodash.js`` (``scripts/test`` fetches it
    with ``npm pack``); without it, or without node, the test fails."""
    path = os.environ.get("DEBOUNCE_LODASH_JS")
    node = shutil.which("node")
    assert path and os.path.isfile(path), (
        "set DEBOUNCE_LODASH_JS to lodash 4.17.21's lodash.js (scripts/test fetches it)"
    )
    assert node is not None, "node is needed to run lodash itself (Debian's nodejs package)"
    scripts = [
        {
            "name": c.name,
            "options": c.options.__dict__,
            "steps": [[t, op, None if op == "look" else arg] for t, op, arg in c.steps],
            "then": list(c.then),
        }
        for c in CASES.values()
    ]
    out = subprocess.run(
        [node, "-e", NODE_DRIVER, path],
        input=json.dumps(scripts),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    real = json.loads(out.stdout)
    assert len(real) == len(CASES) > 40
    for c in CASES.values():
        mine = lodash(c.options, c.steps, then=c.then)
        assert [list(r) for r in mine.runs] == real[c.name]["runs"], c.name
        assert [list(s) for s in mine.seen] == real[c.name]["seen"], c.name


# The QUnit cases of the three modules (``lodash.debounce and lodash.throttle`` once per
# function), and what this module does with each: "played" (a case above, as it is),
# "differs" (played, with a deliberate difference asserted as documented), "n/a".
QUNIT = {
    "debounce: should debounce a function": "played",
    "debounce: subsequent debounced calls return the last `func` result": "played",
    "debounce: should not immediately call `func` when `wait` is `0`": "played",
    "debounce: should apply default options": "played",
    "debounce: should support a `leading` option": "played",
    "debounce: subsequent leading debounced calls return the last `func` result": "played",
    "debounce: should support a `trailing` option": "differs",
    "debounce: should support a `maxWait` option": "played",
    "debounce: should support `maxWait` in a tight loop": "played",
    "debounce: should queue a trailing call for subsequent debounced calls after `maxWait`": (
        "played"
    ),
    "debounce: should cancel `maxDelayed` when `delayed` is invoked": "played",
    "debounce: should invoke the trailing call with the correct arguments and `this` binding": (
        "played"
    ),
    "throttle: should throttle a function": "played",
    "throttle: subsequent calls should return the result of the first call": "played",
    "throttle: should clear timeout when `func` is called": "played",
    "throttle: should not trigger a trailing call when invoked once": "played",
    "throttle: should trigger a call when invoked repeatedly": "played",
    "throttle: should trigger a call when invoked repeatedly and `leading` is `false`": "played",
    "throttle: should trigger a second throttled call as soon as possible": "played",
    "throttle: should apply default options": "played",
    "throttle: should support a `leading` option": "played",
    "throttle: should support a `trailing` option": "played",
    "throttle: should not update `lastCalled`, at the end of the timeout, when `trailing` is "
    "`false`": "played",
    "throttle: should work with a system time of `0`": "played",
    **{
        f"{method}: {name}": status
        for method in FUNCS
        for name, status in {
            "should not error for non-object `options` values": "n/a",
            "should use a default `wait` of `0`": "differs",
            "should invoke `func` with the correct `this` binding": "n/a",
            "supports recursive calls": "played",
            "should work if the system time is set backwards": "played",
            "should support cancelling delayed calls": "played",
            "should reset `lastCalled` after cancelling": "played",
            "should support flushing delayed calls": "played",
            "should noop `cancel` and `flush` when nothing is queued": "played",
        }.items()
    },
}


def test_every_qunit_case_is_played_or_listed_as_not_applicable():
    assert len(QUNIT) == 42
    statuses = list(QUNIT.values())
    assert (statuses.count("played"), statuses.count("differs"), statuses.count("n/a")) == (
        35,
        3,
        4,
    )
    played = {c.name.split(" (")[0] for c in CASES.values()}
    for name, status in QUNIT.items():
        assert (name in played) == (status != "n/a"), name
    extra = {c.name for c in CASES.values() if c.name.startswith(("issue 15", "difference"))}
    assert played - set(QUNIT) == extra
