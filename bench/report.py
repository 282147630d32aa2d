"""Figures of the comparison benchmark: per-run analysis, ratios to the limits, the JSON, the
markdown table and the SVG plot (hand-written: no plotting dependency)."""

from __future__ import annotations

import bisect
import json
import statistics
from pathlib import Path
from typing import Any

US = 1e6
THIS_APP = ("redis", "database")
TITLES = {
    "a": "a. 200 saves every 2 ms, 30 ms job",
    "b": "b. a save every 10 ms for 5 s, 30 ms job",
    "c": "c. burst of 20, then one save while the job (200 ms) runs",
    "d": "d. 1,000 saves of one row, as fast as possible, 30 ms job",
    "e": "e. 10 triggers (post_save) on each of 10,000 rows, from 2 processes, empty job",
    "f": "f. 4 processes trigger one row as fast as they can, empty job",
}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def analyse(
    scenario: str, contender: str, info: dict[str, Any], runs: list[list[Any]]
) -> dict[str, Any]:
    """Turn the trigger times and run records of one scenario into its figures.

    A run record is ``[contender, pk, version seen, start, end, pid, triggers]``. Two runs of
    one key overlap when one starts before the other ends. The final state is applied for a
    key when its last run started after its last trigger and saw the last saved version.
    """
    stream = info.pop("stream")
    by_key: dict[int, list[list[Any]]] = {}
    for r in runs:
        by_key.setdefault(int(r[1]), []).append(r)
    overlapping, max_conc, delays = 0, 0, []
    applied, to_end, to_start = 0, [], []
    for pk, times in stream.times.items():
        times.sort()
        key_runs = sorted(by_key.get(pk, []), key=lambda r: r[3])
        live_ends: list[float] = []
        marked: set[int] = set()
        for i, r in enumerate(key_runs):
            live_ends = [e for e in live_ends if e > r[3]]
            if live_ends:
                marked.add(i)
                marked.update(
                    j for j in range(i) if key_runs[j][4] > r[3] and key_runs[j][3] <= r[3]
                )
            live_ends.append(r[4])
            max_conc = max(max_conc, len(live_ends))
            k = bisect.bisect_right(times, r[3])
            if k:
                delays.append(r[3] - times[k - 1])
        overlapping += len(marked)
        if key_runs:
            last = key_runs[-1]
            if last[3] >= times[-1] and last[2] == stream.final[pk]:
                applied += 1
            to_end.append(max(r[4] for r in key_runs) - times[-1])
            to_start.append(last[3] - times[-1])
    keys = len(stream.times)
    triggers = info.pop("triggers_made", stream.count)
    out: dict[str, Any] = {
        "scenario": scenario,
        "contender": contender,
        "triggers": triggers,
        "keys": keys,
        "runs": len(runs),
        "overlapping_runs": overlapping,
        "max_concurrent_runs_per_key": max_conc,
        "published": info.pop("published"),
        "broker_lpush": info.pop("broker_lpush"),
        "final_applied": applied == keys,
        "keys_final_applied": applied,
        "last_trigger_to_end_s": _r(max(to_end) if to_end else None, 3),
        "last_trigger_to_end_median_s": _r(statistics.median(to_end) if to_end else None, 3),
        "last_trigger_to_last_start_ms": _r(
            statistics.median(to_start) * 1e3 if to_start else None
        ),
        "delay_ms_median": _r(statistics.median(delays) * 1e3 if delays else None),
        "delay_ms_p95": _r(_pct(delays, 0.95) * 1e3 if delays else None),
    }
    if scenario == "f":  # only the last trigger's time is known there
        out["delay_ms_median"] = out["delay_ms_p95"] = None
    if info.get("drain_cut"):
        out["final_applied"] = None  # not measured: what was left was purged
    extra = info.pop("extra_save_at", None)
    if scenario == "c":
        out["extra_save_landed_in_a_run"] = extra is not None and any(
            r[3] <= extra <= r[4] for r in runs
        )
    if scenario == "e":
        out["messages_per_key"] = round(out["published"] / keys, 3)
        out["messages_within_keys"] = out["published"] <= keys
        # Only where the contender keeps state per key (celery-once and celery-singleton hold a
        # lock only while a task is queued or running, so few keys are left to divide by).
        rkeys = info.get("store_redis_keys") or 0
        out["redis_bytes_per_key"] = (
            round(info["store_redis_bytes"] / rkeys, 1) if rkeys >= keys / 10 else None
        )
    if scenario == "f":
        f = info.pop("f")
        out["triggers_per_second"] = f["per_second"]
        out["trigger_errors"] = f["errors"]
        out["trigger_error_samples"] = f["error_samples"]
    out.update(info)
    return out


def ratios(limits: dict[str, Any], results: dict[str, dict[str, Any]], wait: float) -> list[Any]:
    """Every figure of this app against its limit: ``[scenario, store, figure, value, limit,
    ratio, note]``."""
    rows: list[Any] = []
    store_limit = {
        "redis": ("redis_incr_us", "four_process_incr_per_second", "raw INCR"),
        "database": ("pg_update_us", "four_process_update_per_second", "bare UPDATE"),
    }
    floor = wait * 1e3 + limits["publish_to_start_ms"]
    for scenario, by in results.items():
        for store in THIS_APP:
            r = by.get(store)
            if r is None:
                continue
            one, four, name = store_limit[store]
            if r["runs"]:
                rows.append(
                    [
                        scenario,
                        store,
                        "messages per run",
                        round(r["published"] / r["runs"], 2),
                        1,
                        round(r["published"] / r["runs"], 2),
                        "one message per run",
                    ]
                )
            if scenario in "abd" and r["last_trigger_to_last_start_ms"] is not None:
                v = r["last_trigger_to_last_start_ms"]
                rows.append(
                    [
                        scenario,
                        store,
                        "last trigger -> last run start (ms)",
                        v,
                        round(floor, 1),
                        round(v / floor, 2),
                        "wait + bare publish-to-start",
                    ]
                )
            if scenario == "d":
                v = round(r["us_per_save"] - limits["bare_save_us"], 1)
                rows.append(
                    [
                        scenario,
                        store,
                        "trigger cost per save (µs, save minus bare save)",
                        v,
                        limits[one],
                        round(v / limits[one], 2),
                        name,
                    ]
                )
            if scenario == "e" and store == "redis" and r.get("redis_bytes_per_key"):
                v, lim = r["redis_bytes_per_key"], limits["redis_bytes_per_counter_key"]
                rows.append(
                    [
                        scenario,
                        store,
                        "Redis bytes per key",
                        v,
                        lim,
                        round(v / lim, 2),
                        "a plain INCR counter key",
                    ]
                )
            if scenario == "e":
                rows.append(
                    [
                        scenario,
                        store,
                        "messages per key",
                        r["messages_per_key"],
                        1,
                        r["messages_per_key"],
                        "one message per key (issue: must not exceed keys)",
                    ]
                )
            if scenario == "f":
                v = r["triggers_per_second"]
                rows.append(
                    [
                        scenario,
                        store,
                        "triggers/s from 4 processes",
                        v,
                        limits[four],
                        round(v / limits[four], 2),
                        f"{name} from 4 processes",
                    ]
                )
                rows.append(
                    [
                        scenario,
                        store,
                        "triggers/s vs bare publish",
                        v,
                        limits["four_process_publish_per_second"],
                        round(v / limits["four_process_publish_per_second"], 2),
                        "bare Celery publish from 4 processes",
                    ]
                )
    return rows


def checks(results: dict[str, dict[str, Any]]) -> list[tuple[str, bool]]:
    """This app's guarantees, per scenario and store (the run exits non-zero if one fails)."""
    out = []
    for scenario, by in results.items():
        for store in THIS_APP:
            r = by.get(store)
            if r is None:
                continue
            out.append((f"{scenario}/{store}: no overlapping runs", r["overlapping_runs"] == 0))
            if r.get("drain_cut"):
                continue  # what was left was purged: the final state is not measured
            out.append((f"{scenario}/{store}: final state applied", r["final_applied"]))
            if "bookkeeping" in r:
                out.append(
                    (f"{scenario}/{store}: every trigger covered", r["bookkeeping"]["covered"])
                )
    return out


# -- output ---------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 1 else f"{v:,.1f}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _extra(r: dict[str, Any]) -> str:
    s = r["scenario"]
    if s == "c":
        return "extra save landed in a run: " + _fmt(r.get("extra_save_landed_in_a_run"))
    if s == "d":
        return f"{_fmt(r['us_per_save'])} µs/save"
    if s == "e":
        mem = r["worker_memory"]
        parts = [
            f"{_fmt(r['messages_per_key'])} msg/key",
            f"Redis {_fmt(r.get('redis_bytes_per_key'))} B/key",
            f"broker peak {r['broker_redis_peak_bytes'] / 2**20:,.1f} MiB",
            f"worker peak {mem['main_peak_kib'] / 1024:,.0f}"
            f"+{mem['pool_peak_kib'] / 1024:,.0f} MiB",
            f"{r['keys_final_applied']:,}/{r['keys']:,} keys ran after their last trigger",
        ]
        if r.get("drain_cut"):
            parts.append(
                f"worker stopped after {r['drain_cut']['after_seconds']:.0f} s of draining with "
                f"{r['drain_cut']['messages_purged']:,} messages left (purged)"
            )
        return ", ".join(parts)
    if s == "f":
        cov = r.get("bookkeeping", {}).get("covered")
        text = f"{_fmt(r['triggers_per_second'])} triggers/s"
        if cov is not None:
            text += f", every trigger covered: {_fmt(cov)}"
        if r["trigger_errors"]:
            text += f", {r['trigger_errors']:,} errors"
        return text
    return ""


HEAD = [
    "contender",
    "triggers",
    "runs",
    "overlapping",
    "messages",
    "final applied",
    "last trigger→end (s)",
    "delay p50/p95 (ms)",
    "notes",
]


def tables(meta, limits, results, labels, rats, chk) -> str:
    lines = []
    for scenario, by in results.items():
        lines += [
            f"### {meta.get('scenarios', TITLES)[scenario]}",
            "",
            "| " + " | ".join(HEAD) + " |",
        ]
        lines.append("|" + "---|" * len(HEAD))
        for contender, r in by.items():
            row = [
                labels[contender],
                _fmt(r["triggers"]),
                _fmt(r["runs"]),
                _fmt(r["overlapping_runs"]),
                _fmt(r["published"]),
                _fmt(r["final_applied"]),
                _fmt(r["last_trigger_to_end_s"]),
                f"{_fmt(r['delay_ms_median'])} / {_fmt(r['delay_ms_p95'])}",
                _extra(r),
            ]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += ["### Limits (same servers, same run)", "", "| limit | value |", "|---|---|"]
    names = {
        "redis_incr_us": "raw redis-py INCR round trip (µs)",
        "pg_update_us": "bare single-row UPDATE on PostgreSQL (µs)",
        "celery_publish_us": "bare Celery publish, apply_async (µs)",
        "bare_save_us": "Model.save(update_fields=...) with no receiver (µs)",
        "publish_to_start_ms": "bare publish -> task start in the worker (ms)",
        "redis_bytes_per_counter_key": "Redis memory of one INCR counter key (bytes)",
        "four_process_incr_per_second": "INCR on one key from 4 processes (/s)",
        "four_process_update_per_second": "UPDATE of one row from 4 processes (/s)",
        "four_process_publish_per_second": "bare Celery publish from 4 processes (/s)",
    }
    lines += [f"| {names.get(k, k)} | {_fmt(v)} |" for k, v in limits.items()]
    lines += [
        "",
        "### This app as a ratio to its limit",
        "",
        "| scenario | store | figure | value | limit | ratio | limit is |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(_fmt(x) for x in row) + " |" for row in rats]
    lines += ["", "Checks of this app: " + ", ".join(f"{n}: {_fmt(ok)}" for n, ok in chk)]
    lines += [
        "",
        f"{meta['when']}, {meta['seconds']} s, Python {meta['machine']['python']}, "
        f"{meta['machine']['cpus']} CPUs, load average (1 min) "
        f"{meta['machine'].get('load_average_before', ['?'])[0]} before and "
        f"{meta['machine'].get('load_average_after', ['?'])[0]} after (a shared machine); "
        f"{meta['worker']}; this app with wait="
        f"{meta['options']['wait']} s, max_wait={meta['options']['max_wait']} s; "
        f"command: `{meta['command']}`",
    ]
    return "\n".join(lines) + "\n"


COLORS = {
    "per_save": "#9e9e9e",
    "counter": "#ff9800",
    "once": "#8e24aa",
    "singleton": "#e53935",
    "redis": "#1e88e5",
    "database": "#43a047",
}


def svg(results: dict[str, dict[str, Any]], labels: dict[str, str]) -> str:
    """Two log-scale grouped bar charts: runs per scenario, and the median trigger-to-start
    delay (a tick marks the 95th percentile)."""
    import math

    scenarios = list(results)
    contenders = [c for c in COLORS if any(c in by for by in results.values())]
    width, ph, top, left = 920, 250, 40, 70
    group = (width - left - 20) / max(len(scenarios), 1)
    bar = group * 0.8 / max(len(contenders), 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{2 * ph + 180}" '
        'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]

    def panel(y0: float, title: str, value, p95, lo: float, hi: float, unit: str) -> None:
        lo, hi = math.log10(lo), math.log10(hi)

        def y(v: float) -> float:
            v = min(max(v, 10**lo), 10**hi)
            return y0 + ph - (math.log10(v) - lo) / (hi - lo) * ph

        parts.append(
            f'<text x="{left}" y="{y0 - 12}" font-size="13" font-weight="bold">{title}</text>'
        )
        for e in range(int(math.ceil(lo)), int(math.floor(hi)) + 1):
            yy = y(10**e)
            parts.append(
                f'<line x1="{left}" x2="{width - 20}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#ddd"/>'
            )
            parts.append(
                f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{10**e:g}{unit}</text>'
            )
        for i, s in enumerate(scenarios):
            x0 = left + i * group + group * 0.1
            parts.append(
                f'<text x="{left + i * group + group / 2:.1f}" y="{y0 + ph + 16}" '
                f'text-anchor="middle">{s}</text>'
            )
            for j, c in enumerate(contenders):
                r = results[s].get(c)
                v = value(r) if r else None
                if not v:
                    continue
                x = x0 + j * bar
                parts.append(
                    f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{bar * 0.9:.1f}" '
                    f'height="{y0 + ph - y(v):.1f}" fill="{COLORS[c]}">'
                    f"<title>{labels[c]}: {v:g}</title></rect>"
                )
                q = p95(r) if p95 else None
                if q:
                    parts.append(
                        f'<line x1="{x:.1f}" x2="{x + bar * 0.9:.1f}" y1="{y(q):.1f}" '
                        f'y2="{y(q):.1f}" stroke="black" stroke-width="1.5"/>'
                    )

    runs_max = max((r["runs"] for by in results.values() for r in by.values()), default=10)
    panel(
        top,
        "Runs per scenario (log scale)",
        lambda r: r["runs"],
        None,
        0.5,
        max(runs_max * 1.5, 10),
        "",
    )
    panel(
        top + ph + 60,
        "Trigger-to-start delay, median (bar) and p95 (tick), ms (log scale)",
        lambda r: r["delay_ms_median"],
        lambda r: r["delay_ms_p95"],
        0.1,
        1_000_000,
        "",
    )
    ly = 2 * ph + top + 95
    for j, c in enumerate(contenders):
        x = left + (j % 3) * 280
        yy = ly + (j // 3) * 18
        parts.append(f'<rect x="{x}" y="{yy - 9}" width="12" height="12" fill="{COLORS[c]}"/>')
        parts.append(f'<text x="{x + 17}" y="{yy + 1}">{labels[c]}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def summary(results: dict[str, dict[str, Any]], labels: dict[str, str]) -> str:
    """One line per contender, one column per scenario: runs, messages, overlapping runs and
    whether the final state was applied."""
    scen = list(results)
    head = "| contender | " + " | ".join(scen) + " |"
    lines = [
        "runs / broker messages / overlapping runs / final state applied "
        "(f: triggers per second from 4 processes instead of overlap)",
        "",
        head,
        "|" + "---|" * (len(scen) + 1),
    ]
    contenders = [c for c in COLORS if any(c in by for by in results.values())]
    for c in contenders:
        cells = []
        for sc in scen:
            r = results[sc].get(c)
            if r is None:
                cells.append("-")
                continue
            third = (
                f"{_fmt(r['triggers_per_second'])}/s" if sc == "f" else _fmt(r["overlapping_runs"])
            )
            final = {True: "yes", False: "**no**", None: "n/m"}[r["final_applied"]]
            cells.append(f"{_fmt(r['runs'])} / {_fmt(r['published'])} / {third} / {final}")
        lines.append(f"| {labels[c]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render(doc: dict[str, Any]) -> tuple[str, str]:
    """The markdown and the SVG of a results document (``latest.json``)."""
    rats = [[r[k] for k in RATIO_FIELDS] for r in doc["ratios"]]
    chk = list(doc["checks"].items())
    text = "## Summary\n\n" + summary(doc["results"], doc["contenders"]) + "\n"
    text += tables(doc, doc["limits"], doc["results"], doc["contenders"], rats, chk)
    return text, svg(doc["results"], doc["contenders"])


RATIO_FIELDS = ["scenario", "store", "figure", "value", "limit", "ratio", "limit_is"]


def write(out: Path, meta, limits, results, labels) -> bool:
    """Write latest.json, latest.md and latest.svg; print the table; True when every check of
    this app holds."""
    rats = ratios(limits, results, meta["options"]["wait"])
    chk = checks(results)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        **meta,
        "limits": limits,
        "scenarios": {s: TITLES[s] for s in results},
        "contenders": labels,
        "results": results,
        "ratios": [dict(zip(RATIO_FIELDS, r, strict=True)) for r in rats],
        "checks": {n: ok for n, ok in chk},
    }
    (out / "latest.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    text, picture = render(doc)
    (out / "latest.md").write_text(text)
    (out / "latest.svg").write_text(picture)
    print(text)
    return all(ok for _n, ok in chk)


if __name__ == "__main__":  # re-render latest.md and latest.svg from latest.json
    results_dir = Path(__file__).resolve().parent / "results"
    text, picture = render(json.loads((results_dir / "latest.json").read_text()))
    (results_dir / "latest.md").write_text(text)
    (results_dir / "latest.svg").write_text(picture)
    print(text)
