"""lodash 4.17.21's own ``debounce``/``throttle`` cases on the rules alone: every case of
``tests/stores/test_lodash.py`` (its ``CASES``, imported from there: that module holds the
list) played on one key's ``KeyModel`` with a fake clock, a pump and a worker without a store
(``tests/support/lodash_rules.py``), once per pump interval of ``INTERVALS``, and checked
against the Python transcription of lodash (``tests/support/lodash.py``): the case's own
assertions, the runs (time and argument) and what the case observes after every step.

The four deliberate differences (README, "Where this differs from lodash") are asserted as
``tests/stores/test_lodash.py`` asserts them on a store. The stores' test plays the same
cases on Redis and the database; this one needs no server, so a rule change that breaks a
lodash case fails here first.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.stores.test_lodash import (
    CANCEL_LIVE,
    CANCEL_UNCLAIMED,
    CASES,
    INTERVALS,
    JOIN_UNCLAIMED,
    THROTTLE_LIVE,
    Case,
    check_looks,
)
from tests.support.lodash import Trace, lodash
from tests.support.lodash_rules import RulesPlayer

DIFFERENCES = {c.name for c in (JOIN_UNCLAIMED, CANCEL_UNCLAIMED, CANCEL_LIVE, THROTTLE_LIVE)}
CONFORMING = [name for name in CASES if name not in DIFFERENCES]


def play(c: Case, *, interval: float = 1.0, **player: Any) -> tuple[Trace, RulesPlayer]:
    p = RulesPlayer(c.options, interval=interval, then=c.then, **player)
    return p.play(c.steps), p


def test_every_case_of_the_store_test_is_played_here() -> None:
    assert len(CASES) >= 45, sorted(CASES)  # 48 when written: the import found them all
    assert len(DIFFERENCES) == 4 and DIFFERENCES <= set(CASES)


@pytest.mark.parametrize("name", CONFORMING)
def test_the_rules_play_lodash_s_case(name: str) -> None:
    c = CASES[name]
    want = lodash(c.options, c.steps, then=c.then)
    check_looks(c, want, "lodash")
    for interval in INTERVALS:
        got, _player = play(c, interval=interval)
        where = f"{c.name}, pump interval {interval} s"
        check_looks(c, got, f"rules, pump interval {interval} s")
        assert got.runs == want.runs, f"{where}: runs (ms, arg) {got.runs}, lodash {want.runs}"
        assert got.seen == want.seen, f"{where}: seen {got.seen}, lodash {want.seen}"


def test_a_trigger_before_the_claim_joins_the_leading_run() -> None:
    c = JOIN_UNCLAIMED
    assert lodash(c.options, c.steps).runs == [(0, "a"), (33, "b")]
    got, player = play(c, latency=5)
    assert [(r.at, r.arg, r.triggers) for r in player.runs] == [(5, "b", 2)]
    assert got.runs == [(5, "b")]


def test_cancel_before_the_claim_drops_the_leading_run() -> None:
    c = CANCEL_UNCLAIMED
    assert lodash(c.options, c.steps).runs == [(0, "a"), (2, "b")]
    _got, player = play(c, latency=5)
    assert player.cancelled == [1]
    assert [(r.at, r.arg) for r in player.runs] == [(7, "b")]


def test_cancel_while_a_run_is_live_resets_the_edge_and_the_next_run_waits_for_it() -> None:
    c = CANCEL_LIVE
    assert lodash(c.options, c.steps).runs == [(0, "a"), (6, "b")]
    _got, player = play(c, body=20)
    assert player.cancelled == [0]
    due = player.results[1].due_at
    assert due is not None and player.ms(due) == 6  # a leading edge: due at once
    assert [(r.at, r.arg) for r in player.runs] == [(0, "a"), (20, "b")]


def test_a_throttle_follow_up_waits_for_the_live_run() -> None:
    c = THROTTLE_LIVE
    assert lodash(c.options, c.steps).runs == [(0, "a"), (300, "b"), (400, "c")]
    _got, player = play(c, body=200)
    assert [(r.at, r.arg) for r in player.runs] == [(0, "a"), (300, "b"), (500, "c")]
