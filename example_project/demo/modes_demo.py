"""``manage.py demo --modes``: every mode of the mode table (docs/guide/modes.md),
probed with real saves.

For each mode three probes run against the real worker, each on fresh rows:

- burst:  20 saves, one every 5 ms (collect: over 8 rows in turn)
- stream: a save every 50 ms for 3 s (gaps < W = 0.3 s)
- during: one save whose run lasts 1 s, then a second save 0.2 s into that run

Each probe is summarised (runs, triggers per run, when the runs started) and checked against
what the mode table (docs/guide/modes.md) says: how many runs, and when each run started,
against the time the table gives it (from the saves and the earlier runs; never before it, at
most ``LATE`` after it); the command exits non-zero when a check fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django_debounce.models import DebounceKey
from example_project.demo import modes
from example_project.demo.models import DemoRun, ModeDoc

W = modes.WAIT
# A run may start this much after the time the table gives it: dispatch latency on a busy
# 2-core machine with SQLite (each commit waits for the database lock) and the filesystem
# broker (polled every 10 ms).
LATE = 0.25
# ... and this much before it: a save is timed before and after it (the trigger is between),
# and the two processes read one clock.
EARLY = 0.02
# A run's recorded start comes this much after its claim, at most (the claim is what max_wait
# counts from).
CLAIM = 0.05
INF = float("inf")


@dataclass
class Probe:
    mode: str
    name: str
    saves: list[float] = field(default_factory=list)  # time.time() before each save
    after: list[float] = field(default_factory=list)  # time.time() after each save
    runs: list[DemoRun] = field(default_factory=list)
    dropped: int = 0  # triggers counted as cancelled (trailing=False)
    problems: list[str] = field(default_factory=list)

    @property
    def overlapped(self) -> bool:
        spans = sorted((r.started, r.finished) for r in self.runs)
        return any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))

    def summary(self) -> str:
        if not self.runs:
            return "no run"
        first = self.saves[0]
        parts = []
        for r in self.runs:
            what = f"{len(r.items)} items" if r.items is not None else f"{r.triggers} trig"
            parts.append(f"+{(r.started - first) * 1000:.0f}ms:{what}")
        text = f"{len(self.runs)} run{'s' if len(self.runs) != 1 else ''} [{', '.join(parts)}]"
        if len(parts) > 4:
            text = f"{len(self.runs)} runs [{', '.join(parts[:2])}, ..., {parts[-1]}]"
        if self.dropped:
            text += f", {self.dropped} dropped"
        if self.overlapped:
            text += ", overlapping"
        return text


def _wait_for(predicate: Callable[[], Any], timeout: float, message: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {message}")
        time.sleep(0.02)


def _keys(mode: str) -> Any:
    return DebounceKey.objects.filter(task_name=f"demo.mode.{mode}")


def _settled(mode: str, expect_runs: Callable[[], int]) -> bool:
    keys = list(_keys(mode))
    runs = DemoRun.objects.filter(scenario=f"mode:{mode}")
    return (
        bool(keys)
        and all(k.pending == 0 and k.running_until is None for k in keys)
        and not runs.filter(finished=0).exists()
        and runs.count() == sum(k.runs for k in keys)
        and runs.count() >= expect_runs()
    )


def _clean(mode: str) -> None:
    DemoRun.objects.filter(scenario=f"mode:{mode}").delete()
    ModeDoc.objects.filter(mode=mode).delete()
    _keys(mode).delete()


def _rows(mode: str, n: int) -> list[ModeDoc]:
    # bulk_create sends no post_save: the rows exist before the probe without a trigger
    ModeDoc.objects.bulk_create([ModeDoc(mode=mode) for _ in range(n)])
    return list(ModeDoc.objects.filter(mode=mode).order_by("pk"))


def _save(probe: Probe, row: ModeDoc, job_ms: int = 30) -> None:
    row.version += 1
    row.job_ms = job_ms
    probe.saves.append(time.time())
    row.save()
    probe.after.append(time.time())


def run_probe(mode: str, name: str, settle_timeout: float) -> Probe:
    _clean(mode)
    probe = Probe(mode, name)
    rows = _rows(mode, 8 if mode == "collect" else 1)
    start = time.perf_counter()
    if name == "burst":
        for i in range(20):
            time.sleep(max(0.0, start + i * 0.005 - time.perf_counter()))
            _save(probe, rows[i % len(rows)])
    elif name == "stream":
        for i in range(60):
            time.sleep(max(0.0, start + i * 0.05 - time.perf_counter()))
            _save(probe, rows[i % len(rows)])
    else:  # during
        _save(probe, rows[0], job_ms=1000)
        first = _wait_for(
            lambda: DemoRun.objects.filter(scenario=f"mode:{mode}").first(),
            settle_timeout,
            "the first run to start",
        )
        time.sleep(max(0.0, first.started + 0.2 - time.time()))  # 0.2 s into the run
        _save(probe, rows[-1] if mode == "collect" else rows[0])
    _wait_for(lambda: _settled(mode, lambda: 1), settle_timeout, f"{mode}/{name} to settle")
    probe.runs = list(DemoRun.objects.filter(scenario=f"mode:{mode}").order_by("started"))
    probe.dropped = sum(k.cancelled for k in _keys(mode))
    probe.problems = check(probe) + timing(probe)
    return probe


def check(p: Probe) -> list[str]:
    """What the mode table says of this mode and probe; returns what does not hold."""
    out: list[str] = []
    runs, saves, n = p.runs, p.saves, len(p.saves)
    if not runs:
        return ["no run"]
    first_save, last_save = saves[0], saves[-1]
    starts = [r.started for r in runs]
    covered = sum(r.triggers or 0 for r in runs) + p.dropped
    if covered != n:
        out.append(f"runs and drops cover {covered} saves, expected {n}")
    if p.mode != "leading_only" and starts[-1] < last_save:
        out.append("the last run started before the last save")
    if p.mode != "overlap" and p.overlapped:
        out.append("runs overlapped")

    def count(lo: int, hi: int) -> None:
        if not lo <= len(runs) <= hi:
            out.append(f"{len(runs)} runs, expected {lo}..{hi}")

    leading_edge = p.mode in ("leading", "leading_only", "throttle")
    if leading_edge and starts[0] > first_save + W:
        out.append("the first run did not start at once (leading edge)")
    if p.name == "burst":
        if p.mode in ("debounce", "bounded", "overlap"):
            count(1, 1)
            if starts[0] < last_save + W - 0.02:
                out.append("the run started before the quiet period after the last save")
        elif p.mode in ("leading", "throttle"):
            count(1, 2)
        elif p.mode == "leading_only":
            count(1, 1)
        elif p.mode == "coalesce":
            count(1, n // 4)
        elif p.mode == "collect":
            count(2, 4)
            if any(len(r.items or []) > modes.COLLECT_LIMIT for r in runs):
                out.append("a batch exceeded collect_limit")
            if sorted({i for r in runs for i in r.items or []}) != sorted(
                ModeDoc.objects.filter(mode="collect").values_list("pk", flat=True)
            ):
                out.append("the batches do not hold every saved row")
    elif p.name == "stream":
        span = last_save - first_save
        if p.mode in ("debounce", "overlap"):
            count(1, 1)
        elif p.mode == "bounded":
            count(2, int(span / modes.MAX_WAIT) + 2)
        elif p.mode == "leading":
            count(2, 2)
        elif p.mode == "leading_only":
            count(1, 1)
        elif p.mode == "throttle":
            count(int(span / W / 2), int(span / W) + 2)
            gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
            if gaps and min(gaps) < W - 0.02:
                out.append(f"two runs started {min(gaps) * 1000:.0f} ms apart, less than W")
        elif p.mode == "coalesce":
            count(3, n)
        elif p.mode == "collect":
            count(2, n)
            if any(len(r.items or []) > modes.COLLECT_LIMIT for r in runs):
                out.append("a batch exceeded collect_limit")
    else:  # during
        gap = saves[1] - saves[0]
        if p.mode == "leading_only":
            if abs(gap - W) > 0.05:
                count(1 if gap < W else 2, 1 if gap < W else 2)
        else:
            count(2, 2)
        if len(runs) == 2:
            a, b = runs
            if p.mode == "overlap" and not p.overlapped:
                out.append("the second run waited for the first (overlap=True lets it start)")
            if p.mode in ("debounce", "bounded", "leading") and b.started < saves[1] + W - 0.02:
                out.append("the follow-up started before W after the second save")
    return out


def timing(p: Probe) -> list[str]:
    """When each run started, against the time docs/guide/modes.md's table gives it; returns what
    does not hold. The runs cover the saves in order (``triggers`` each; with ``trailing=False``
    the saves between are dropped); a run's flight opens with its first save, which either
    continues the stream (within ``wait`` of the save before, and, with ``max_wait``, within
    ``max_wait`` of the last run's start) or starts a new burst. A new burst runs at once with
    ``leading``; any other flight ``wait`` after its last save, at most ``max_wait`` after its
    anchor (the last run's start when it continues the stream, else its first save); without
    ``overlap``, never before the run before it has ended. A save timed close to a boundary is
    allowed either way."""
    task = modes.MODES[p.mode]
    wait = task.wait
    max_wait = task.debounce_max_wait
    if max_wait is not None:
        max_wait = max(max_wait, wait)
    if not p.runs:
        return []
    before, after, runs = p.saves, p.after, p.runs
    if task.debounce_collect and p.name != "during":
        # rows are saved in turn, so the save that brings the collect_limit-th item fills the
        # first batch, which then runs at once; the last batch runs wait after the last save
        # at the latest (a batch that is full, or holds items of an earlier one, sooner)
        fill = modes.COLLECT_LIMIT - 1
        out = []
        if not before[fill] - EARLY <= runs[0].started <= after[fill] + LATE:
            out.append(
                f"the first batch started {_ms(runs[0].started - after[fill])} after it was "
                "full, not at once"
            )
        if runs[-1].started > after[-1] + wait + LATE:
            out.append("the last batch started later than wait after the last save")
        return out
    out = []
    i = 0
    prev: DemoRun | None = None
    for k, run in enumerate(runs):
        if k and not task.debounce_trailing:
            # dropped saves: the next run's first save is a leading edge (wait after the save
            # before it, dropped or not)
            lead = next(
                (x for x in range(i, len(before)) if after[x] - before[x - 1] >= wait), None
            )
            if lead is None:
                out.append(f"run {k + 1}: no save could have led it")
                break
            i = lead
        j = i + (run.triggers or 0) - 1
        if j < i or j >= len(before):
            out.append(f"run {k + 1}: covers {run.triggers} saves, {len(before) - i} left")
            break
        cap = INF if max_wait is None else max_wait
        windows = []  # (earliest, latest) due time, what
        gap_lo = before[i] - after[i - 1] if i else INF
        gap_hi = after[i] - before[i - 1] if i else INF
        since_lo = before[i] - prev.started if prev else INF
        since_hi = after[i] - prev.started + CLAIM if prev else INF
        if gap_hi >= wait or since_hi >= cap:  # a new burst
            if task.debounce_leading:
                windows.append((before[i], after[i], "at once (a leading edge)"))
            else:
                windows.append(
                    (
                        min(before[j] + wait, before[i] + cap),
                        min(after[j] + wait, after[i] + cap),
                        "wait after its last save (max_wait after its first)",
                    )
                )
        if prev is not None and gap_lo < wait and since_lo < cap:  # continues the stream
            windows.append(
                (
                    min(before[j] + wait, prev.started - CLAIM + cap),
                    min(after[j] + wait, prev.started + cap),
                    "wait after its last save (max_wait after the last run started)",
                )
            )
        if prev is not None and not task.debounce_overlap:
            windows = [(max(lo, prev.finished), max(hi, prev.finished), w) for lo, hi, w in windows]
        if not any(lo - EARLY <= run.started <= hi + LATE for lo, hi, _w in windows):
            said = "; or ".join(
                f"{w}: +{_ms(lo - before[0])}..+{_ms(hi - before[0] + LATE)}"
                for lo, hi, w in windows
            )
            out.append(f"run {k + 1} started at +{_ms(run.started - before[0])}; the table: {said}")
        prev = run
        i = j + 1
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}ms"


def run_all(settle_timeout: float, write: Callable[[str], None]) -> list[Probe]:
    probes = []
    for mode in modes.MODES:
        for name in ("burst", "stream", "during"):
            write(f"  {mode:13s} {name} ...")
            probes.append(run_probe(mode, name, settle_timeout))
    return probes


def table(probes: list[Probe]) -> str:
    by_mode: dict[str, dict[str, Probe]] = {}
    for p in probes:
        by_mode.setdefault(p.mode, {})[p.name] = p
    rows = [["mode", "burst (20 saves, 5 ms)", "stream (50 ms, 3 s)", "save during a 1 s run"]]
    for mode, got in by_mode.items():
        rows.append(
            [mode]
            + [
                ("" if got[n].problems == [] else "FAIL ") + got[n].summary()
                for n in ("burst", "stream", "during")
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(
        f"W = {W:g} s; bounded: max_wait = {modes.MAX_WAIT:g} s; collect: 8 rows, "
        f"collect_limit = {modes.COLLECT_LIMIT}; +ms: run start after the first save. Every "
        f"start is checked against the time docs/guide/modes.md's table gives it (at most "
        f"{LATE * 1000:.0f} ms late)."
    )
    for p in probes:
        for problem in p.problems:
            lines.append(f"FAIL {p.mode}/{p.name}: {problem}")
    return "\n".join(lines)
