"""Small bar charts drawn on the server as inline SVG (no JavaScript): per bucket, triggers in
(light) and runs out (dark) on one linear scale, each bar with a ``<title>`` tooltip."""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

TRIGGERS_COLOUR = "#79aec8"
RUNS_COLOUR = "#264b5d"
TEXT_STYLE = 'font-family="sans-serif" font-size="11" fill="currentColor"'


def _bars(
    triggers: Sequence[int],
    runs: Sequence[int],
    labels: Sequence[str],
    *,
    left: float,
    top: float,
    width: float,
    height: float,
) -> list[str]:
    n = max(len(triggers), 1)
    peak = max([*triggers, *runs, 1])
    slot = width / n
    bar = slot * 0.42
    parts = []
    for i, (t, r) in enumerate(zip(triggers, runs, strict=True)):
        label = escape(labels[i]) if i < len(labels) else ""
        for offset, value, colour, what in (
            (slot * 0.06, t, TRIGGERS_COLOUR, "triggers"),
            (slot * 0.06 + bar, r, RUNS_COLOUR, "runs"),
        ):
            h = height * value / peak
            parts.append(
                f'<rect x="{left + i * slot + offset:.1f}" y="{top + height - h:.1f}" '
                f'width="{bar:.1f}" height="{h:.1f}" fill="{colour}">'
                f"<title>{label}: {value} {what}</title></rect>"
            )
    return parts


def bar_chart(
    triggers: Sequence[int],
    runs: Sequence[int],
    labels: Sequence[str],
    *,
    caption: str = "",
    note: str = "",
) -> SafeString:
    """A chart of ``triggers`` and ``runs`` per bucket (equal-length sequences of counts),
    ``labels`` naming each bucket (the first, middle and last are printed under the axis).
    ``caption`` is the chart's accessible name; ``note`` is printed at its top right (such as
    the time zone of the labels).
    Returns an inline ``<svg>`` element, safe to put in a template."""
    width, height = 760, 180
    left, right, top, bottom = 48.0, 8.0, 22.0, 22.0
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max([*triggers, *runs, 1])
    parts = [
        f'<svg class="debounce-chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(caption)}">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#ccc"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" {TEXT_STYLE}>{peak}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" {TEXT_STYLE}>0</text>',
        f'<rect x="{left}" y="4" width="10" height="10" fill="{TRIGGERS_COLOUR}"/>',
        f'<text x="{left + 14}" y="13" {TEXT_STYLE}>triggers in</text>',
        f'<rect x="{left + 90}" y="4" width="10" height="10" fill="{RUNS_COLOUR}"/>',
        f'<text x="{left + 104}" y="13" {TEXT_STYLE}>runs out</text>',
    ]
    if note:
        parts.append(
            f'<text class="debounce-chart-note" x="{width - right}" y="13" text-anchor="end" '
            f"{TEXT_STYLE}>{escape(note)}</text>"
        )
    parts += _bars(triggers, runs, labels, left=left, top=top, width=plot_w, height=plot_h)
    n = len(labels)
    if n:
        slot = plot_w / n
        for i, anchor in ((0, "start"), (n // 2, "middle"), (n - 1, "end")):
            x = left + i * slot + (slot / 2 if anchor == "middle" else 0 if i == 0 else slot)
            parts.append(
                f'<text x="{x:.1f}" y="{height - 6}" text-anchor="{anchor}" {TEXT_STYLE}>'
                f"{escape(labels[i])}</text>"
            )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text in it is escaped above


def sparkline(triggers: Sequence[int], runs: Sequence[int], labels: Sequence[str]) -> SafeString:
    """A small ``bar_chart`` without axes, for a table cell."""
    width, height = 144, 28
    parts = [
        f'<svg class="debounce-sparkline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="triggers and runs over time">'
    ]
    parts += _bars(triggers, runs, labels, left=0, top=1, width=width, height=height - 2)
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text in it is escaped above
