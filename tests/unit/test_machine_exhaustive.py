"""Every sequence of up to ``DEPTH`` steps of one key with two workers, breadth first, on the
rules alone (``django_debounce/machine.py``, with the ledger of ``tests/support/rules.py``).

The steps, from every state: a trigger with the task's options, with ``wait=0``, with a
shorter wait, with a smaller ``max_wait`` (each a row-path trigger, which seals the counter
first); a trigger a Redis counter absorbs, folded by the next step that needs the row; a
trigger a counter absorbs that Redis then forgets (it never reaches the row: the row does
not count it, and the flight it joined must still run after it); a claim by worker A or B
(the first message out, early or on time, or else the pump's take when the entry is due, and
the delivery of what it published); the last message delivered again; a finish ok, and a
failure to retry after ``U``, by A or B; a lost run (its worker dies and the clock goes to
its lease end); flush; cancel; the clock forward by half a wait, a wait, a lease; and a
transaction rolled back (a trigger, a claim, a finish, a flush or a cancel applied to a copy
that is thrown away: the state before it stays, and the copy shares nothing with it).

States are deduplicated by ``KeyLedger.canonical`` (the rules' state and the ledger's, every
time relative to the clock, sequences as current or older, the history as its counts). At
every distinct state reached the invariants I1-I8 are checked (``KeyLedger.check``, which
reads only what the canonical form keeps), and from every distinct state (at the last depth,
one in ``LEAF_DRAIN``) everything left is run to the end (``drain``): nothing may stay
pending, and every trigger, forgotten ones included, is covered by a run claimed after it.

Two task shapes: a debounce with a ``max_wait`` (searched to depth 6: 86,601 distinct states)
and a throttle whose runs may overlap (depth 5: 7,118). The number of distinct states is
printed (``-s``) and held to a lower bound, so that a search that silently shrinks fails.
``DEBOUNCE_RULES_DEPTH=N`` searches both to depth N (6 for both takes about a minute more; 7,
several minutes).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable

import pytest

from django_debounce.machine import Config, KeyModel
from tests.support.call_options import rules_options
from tests.support.rules import KeyLedger

U = 1000  # the search's time unit (microseconds): wait 2U, lease 3U
START = 1_893_456_000_000_000

CONFIGS = {
    # a debounce with a max_wait, no overlap: the default shape of a task
    "debounce": Config(
        wait=2 * U,
        max_wait=5 * U,
        leading=False,
        trailing=True,
        overlap=False,
        collect_limit=None,
        lease=3 * U,
    ),
    # a throttle (leading and trailing edges, max_wait = wait) whose runs may overlap
    "throttle-overlap": Config(
        wait=2 * U,
        max_wait=2 * U,
        leading=True,
        trailing=True,
        overlap=True,
        collect_limit=None,
        lease=3 * U,
    ),
}
# how deep each is searched (the second one less: the tier's minute), and the distinct states
# found when this was written (86,601 and 7,118): a search that finds fewer lost a step
DEPTH = {"debounce": 6, "throttle-overlap": 5}
FLOOR = {"debounce": 85_000, "throttle-overlap": 7_000}
if os.environ.get("DEBOUNCE_RULES_DEPTH"):
    DEPTH = dict.fromkeys(CONFIGS, int(os.environ["DEBOUNCE_RULES_DEPTH"]))

# everything left is run from every distinct state, and from one in LEAF_DRAIN of the last
# depth's (the tier's minute)
LEAF_DRAIN = 8

Step = Callable[[KeyLedger], bool]  # applies itself; False: not applicable here


def trigger(own: dict[str, int] | None) -> Step:
    def step(k: KeyLedger) -> bool:
        k.trigger(1, own)
        return True

    return step


def counted(k: KeyLedger) -> bool:
    if not k.can_count():
        return False
    k.count()
    return True


def forgotten(k: KeyLedger) -> bool:
    if not k.can_count():
        return False
    k.count()
    k.forget()
    return True


def claim(worker: str) -> Step:
    def step(k: KeyLedger) -> bool:
        if k.pool:
            k.deliver(0, worker)
            return True
        if k.model.entry is not None and k.model.entry <= k.now:
            if k.take() is not None:
                k.deliver(len(k.pool) - 1, worker)
            return True
        return False

    return step


def again(k: KeyLedger) -> bool:
    if not k.delivered:
        return False
    k.fire(k.delivered[-1], "A")
    return True


def finish(worker: str, outcome: str) -> Step:
    def step(k: KeyLedger) -> bool:
        runs = k.open_runs(worker)
        if not runs:
            return False
        k.finish(runs[0], outcome, U)
        return True

    return step


def lost(k: KeyLedger) -> bool:
    runs = k.open_runs()
    if not runs:
        return False
    run = runs[0]
    k.crash(run)
    k.now = max(k.now, run.lease_end)
    return True


def flush(k: KeyLedger) -> bool:
    k.flush()
    return True


def cancel(k: KeyLedger) -> bool:
    k.cancel()
    return True


def clock(delta: int) -> Step:
    def step(k: KeyLedger) -> bool:
        k.now += delta
        return True

    return step


ROLLED_BACK = [trigger(None), claim("A"), flush]


def rollback(k: KeyLedger) -> bool:
    """Each of a few steps in a transaction that rolls back: the state before it stays."""
    before = k.canonical()
    for step in ROLLED_BACK:
        step(k.clone())
    assert k.canonical() == before, "a discarded step changed the state it was copied from"
    return False  # the state is the one before: nothing new to visit


STEPS: dict[str, Step] = {
    "trigger": trigger(None),
    "trigger wait=0": trigger({"wait": 0}),
    "trigger shorter wait": trigger({"wait": U}),
    "trigger smaller max_wait": trigger({"max_wait": 3 * U}),
    "counted": counted,
    "forgotten": forgotten,
    "claim A": claim("A"),
    "claim B": claim("B"),
    "delivered again": again,
    "ok A": finish("A", "ok"),
    "ok B": finish("B", "ok"),
    "retry A": finish("A", "retry"),
    "retry B": finish("B", "retry"),
    "lost": lost,
    "flush": flush,
    "cancel": cancel,
    "clock +wait/2": clock(U),
    "clock +wait": clock(2 * U),
    "clock +lease": clock(3 * U),
    "rolled back": rollback,
}


def search(cfg: Config, depth: int) -> tuple[int, list[int]]:
    """Breadth first from a key with no state: returns the distinct states and how many were
    new at each depth. A failing invariant names the sequence that reached it."""
    root = KeyLedger(cfg, START, retake=2 * U, direct=U, horizon=6 * U)
    seen = {root.canonical()}
    frontier: list[tuple[KeyLedger, tuple[str, ...]]] = [(root, ())]
    per_depth = [1]
    leaves = 0
    for level in range(depth):
        nxt: list[tuple[KeyLedger, tuple[str, ...]]] = []
        for state, path in frontier:
            for name, step in STEPS.items():
                k = state.clone()
                try:
                    if not step(k):
                        continue
                    key = k.canonical()
                    if key in seen:
                        continue  # checked when first reached (the checks read only the key)
                    seen.add(key)
                    k.check()
                    if level < depth - 1 or leaves % LEAF_DRAIN == 0:
                        k.clone().drain(checks=False)
                    leaves += level == depth - 1
                except AssertionError as error:
                    raise AssertionError(f"after {[*path, name]}: {error}") from error
                nxt.append((k, (*path, name)))
        per_depth.append(len(nxt))
        frontier = nxt
    return len(seen), per_depth


@pytest.mark.parametrize("name", CONFIGS)
def test_every_short_sequence_keeps_the_invariants(name: str) -> None:
    depth = DEPTH[name]
    states, per_depth = search(CONFIGS[name], depth)
    print(f"\n{name}: {states} distinct states to depth {depth}, new per depth {per_depth}")
    if depth >= {"debounce": 6, "throttle-overlap": 5}[name]:
        assert states >= FLOOR[name], f"the search shrank: {states} states, {per_depth}"
    assert all(per_depth), f"a depth found nothing new: {per_depth}"


def test_a_finish_must_seal_the_counter_its_rejoined_triggers_bound() -> None:
    """Fence 5 (docs/design.md, "The counter and its fences"): a counter absorbs only
    triggers with the fingerprint (payload, wait, max_wait) of the row-path trigger that made
    it, because such a trigger is a plain merge: it moves the due time no earlier, so the
    fold leaves the index entry where it is. A retry (or a lost run) whose triggers rejoin
    the flight after the counter was made gives the flight the run's earlier anchor, and the
    same max_wait then bounds the flight earlier: a fold there would move the due time
    earlier than the entry, and the flight would run late (found by the search above at
    depth 6). So a finish seals the counter (``DatabaseBackend.finish``; the store's test is
    tests/stores/test_counters.py::test_a_finish_seals_the_counter_its_retried_triggers_rejoin)
    and the next trigger takes the row path, which this test shows right.

    The sequence (U = 1 ms; task wait 2U, max_wait 5U, no overlap):
    t=0 trigger (flight 1, due 2U, anchor 0); the clock to 2U; the pump takes it and worker
    A claims run 1; at 2U a trigger with its own max_wait 3U opens flight 2 on the row path
    (anchor 2U, bound 5U, due 4U) and the counter is made with its fingerprint; at 2U run 1
    fails with a retry in U: its trigger rejoins flight 2 (anchor 0, bound 5U, due 4U, entry
    4U); at 2U a trigger with the counter's fingerprint.
    """
    cfg = CONFIGS["debounce"]
    key = KeyModel(cfg, retake=2 * U, direct=U)
    t = START
    payload = {"args": [1], "kwargs": {}}
    key.trigger(t, payload)
    msg, _again = key.take(t + 2 * U)
    assert msg is not None
    claim = key.fire(t + 2 * U, msg.seq).claim
    assert claim is not None
    own = rules_options(key, {"max_wait": 3 * U})  # wait 2U, max_wait 3U: the counter's
    opened, _msg = key.trigger(t + 2 * U, payload, **own)
    assert opened.pending == 1 and not opened.merged
    key.finish(t + 2 * U, claim.run_id, ok=False, retry_in=U)
    assert (key.pending, key.anchor, key.due, key.entry) == (2, t, t + 4 * U, t + 4 * U)

    # a fold there (had the finish not sealed the counter) would leave the entry late
    counter = copy.deepcopy(key)
    counter.fold(1, t + 2 * U, **own)
    assert counter.entry is not None and counter.due is not None
    assert counter.entry > counter.due
    # the row path, which the sealed counter sends the trigger to, publishes the flight for
    # its earlier due time at once (its entry becomes the message's retake time)
    out, row_msg = key.trigger(t + 2 * U, payload, **own)
    assert not out.merged
    assert key.due == t + 3 * U
    assert row_msg is not None and row_msg.countdown == U
    assert key.taken and key.taken_at == t + 3 * U
