"""``KeyModel.fold`` is the same as that many plain merges (docs/design.md, "The counter and
its fences", fence 3): what a Redis counter absorbed moves a key's state exactly as the row
path would have. Pure: no server."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from django_debounce.machine import US, Config, KeyModel


@settings(max_examples=300, deadline=None)
@given(
    wait=st.integers(0, 5),
    max_wait=st.one_of(st.none(), st.integers(0, 10)),
    leading=st.booleans(),
    opened_with=st.one_of(st.none(), st.integers(0, 8)),
    gaps=st.lists(st.integers(0, 4), min_size=1, max_size=8),
)
def test_fold_is_that_many_plain_merges(wait, max_wait, leading, opened_with, gaps):
    cfg = Config(
        wait=wait * US,
        max_wait=None if max_wait is None else max_wait * US,
        leading=leading,
        trailing=True,
        overlap=False,
        collect_limit=None,
        lease=30 * US,
    )
    key = KeyModel(cfg, retake=60 * US, direct=US)
    now = 1_000 * US
    # the flight opens on the row path, maybe with a per-call wait of its own; the counter it
    # makes takes only triggers with that same wait (its fingerprint)
    own = None if opened_with is None else opened_with * US
    key.trigger(now, {"x": 1}, wait=own)
    if key.pending == 0:
        return  # a trailing=False drop: nothing open to fold into
    merged = copy.deepcopy(key)
    folded = copy.deepcopy(key)
    at = now
    for gap in gaps:
        at += gap * US // 2
        out, _msg = merged.trigger(at, {"x": 1}, wait=own)
        assert out.merged, "a trigger with the counter's own options merges"
    folded.fold(len(gaps), at, wait=own)
    assert folded.view() == merged.view()
