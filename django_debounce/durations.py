"""Parsing durations given on the command line (``7d``, ``12h``, ``30m``, ``45s``, ``2w``)."""

from __future__ import annotations

import re
from datetime import timedelta

from django.utils.dateparse import parse_duration

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX = timedelta(days=36500)  # a hundred years: anything longer is a typo
ACCEPTED = "a number with a unit s, m, h, d or w (e.g. 45s, 30m, 12h, 7d, 2w), or HH:MM:SS"
# The clock at the end of Django's duration forms ("25:00:00", "1 02:00:00", "3 days
# 04:05:06", "30:00"): parse_duration adds its fields up unchecked, so "25:61:61" would be
# 1 day 2:02:01.
_CLOCK = re.compile(r"(?:^|(?P<days>.*\S)\s+)(\d+):(\d+)(?::(\d+)(?:[.,]\d+)?)?")


def parse(value: str) -> timedelta:
    """``"7d"`` -> ``timedelta(days=7)``; also Django's duration forms (``"1 02:00:00"``).

    Raises ``ValueError`` naming the accepted forms, also for a bare number (``"7"``), whose
    unit would be a guess.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", value or "")
    if match and not match.group(2):
        # Django's parse_duration would read a bare "7" as 7 seconds: too easy to mistake
        # for 7 days in a purge command, so a unit is required.
        raise ValueError(
            f"{value!r} has no unit: write {match.group(1)}d for days, {match.group(1)}h for "
            f"hours, {match.group(1)}s for seconds ({ACCEPTED})."
        )
    if match:
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
        if seconds > MAX.total_seconds():
            raise ValueError(f"{value!r} is longer than {MAX.days} days: use a shorter duration.")
        return timedelta(seconds=seconds)
    try:
        parsed = parse_duration(value.strip()) if value and value.strip() else None
    except OverflowError:
        parsed = None
    if parsed is None or parsed < timedelta(0):
        raise ValueError(f"{value!r} is not a duration: use {ACCEPTED}.")
    clock = _CLOCK.fullmatch(value.strip())  # minutes or seconds past 59, hours past 23
    if clock is not None:  # after a number of days: out of range
        first, *rest = (int(field) for field in clock.groups()[1:] if field is not None)
        if any(field > 59 for field in rest) or (clock["days"] and len(rest) == 2 and first > 23):
            raise ValueError(
                f"{value!r} is not a duration: in HH:MM:SS minutes and seconds run from 00 to 59 "
                f"(and hours to 23 after a number of days); use {ACCEPTED}."
            )
    return parsed
