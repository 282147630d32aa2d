"""Short texts for operators: durations ("12 s", "4 min 5 s") and projected fire times
("in 12 s"), shared by the admin and ``debounce_status``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

# A flight due this little in the past is firing now, not late.
OVERDUE_AFTER = 1.0


def duration(seconds: float | None) -> str:
    """``seconds`` (>= 0) as a short text: ``"0.35 s"``, ``"4.9 s"``, ``"12 s"``,
    ``"4 min 5 s"``, ``"2 h 10 min"``, ``"3 d 4 h"``; ``""`` for ``None``."""
    if seconds is None:
        return ""
    seconds = max(float(seconds), 0.0)
    if seconds < 10:
        text = f"{seconds:.2f}" if seconds < 1 else f"{seconds:.1f}"
        return f"{text.rstrip('0').rstrip('.')} s"
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def fire_time(row: Any, now: datetime) -> str:
    """When the open flight of ``row`` (a ``DebounceKey``, live values applied) will run:
    ``"in 12 s"``, ``"now"``, ``"overdue 3 s"``, ``"retry in 30 s"`` during a retry's backoff,
    ``"after the live run"`` while a run holds the key (no overlap), or ``""`` when nothing
    is pending."""
    pending = getattr(row, "live_pending", row.pending)
    if not pending or row.due_at is None:
        return ""
    if row.running_until is not None and not row.overlap:
        return "after the live run"
    not_before = getattr(row, "not_before", None)  # the backoff of a retry
    # A retried flight is due at its backoff's end (the stores set due_at = not_before); a
    # trigger during the backoff may only move due_at later, and then "in ..." says when.
    if not_before is not None and not_before >= row.due_at and not_before > now:
        return f"retry in {duration((not_before - now).total_seconds())}"
    ahead = (row.due_at - now).total_seconds()
    if ahead > 0:
        return f"in {duration(ahead)}"
    if -ahead <= OVERDUE_AFTER:
        return "now"
    return f"overdue {duration(-ahead)}"


def ago(moment: datetime | None, now: datetime) -> str:
    """``"12 s ago"`` (``""`` for ``None``; ``"just now"`` within a second)."""
    if moment is None:
        return ""
    seconds = (now - moment).total_seconds()
    return "just now" if seconds < 1 else f"{duration(seconds)} ago"


def cut(text: str, chars: int) -> str:
    """``text`` cut to ``chars`` characters, the last of them "…" when it was cut."""
    return text if len(text) <= chars else text[: chars - 1] + "…"
