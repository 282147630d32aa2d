"""docs/design.md's legend of the key's state (the table under "The database layout") lists
exactly the pairs of ``FIELDS`` in ``django_debounce/backends/rows.py``: each attribute of the
rules' ``KeyModel`` with the ``DebounceKey`` column that holds it, no pair missing, none extra."""

from __future__ import annotations

import re
from pathlib import Path

from django_debounce.backends.rows import FIELDS

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"
INTRO = "maps the rules' attributes to the columns (`FIELDS`):"


def legend() -> list[tuple[str, str]]:
    """The (attribute, column) pairs of the legend (each row holds two pairs side by side,
    separated by an empty cell)."""
    text = DESIGN.read_text(encoding="utf-8")
    assert INTRO in text, f"docs/design.md lost the legend's introduction {INTRO!r}"
    lines = text.split(INTRO, 1)[1].lstrip("\n").splitlines()
    table = []
    for line in lines:
        if not line.startswith("|"):
            break
        table.append(line)
    header, rule, *rows = table
    assert re.fullmatch(r"\|(\s*-+\s*\|)+", rule), rule
    left, right = [], []
    for row in rows:
        cells = [c.strip().strip("`") for c in row.strip().strip("|").split("|")]
        assert len(cells) == 5 and cells[2] == "", row
        for half, pair in ((left, cells[0:2]), (right, cells[3:5])):
            if any(pair):
                half.append(tuple(pair))
    return left + right


def test_the_legend_lists_each_attribute_and_column_of_fields_once():
    pairs = legend()
    assert len(pairs) == len(dict(pairs)), "an attribute is listed twice"
    assert sorted(pairs) == sorted(FIELDS.items())
