"""Figures of the scale benchmark (``bench/scale.py``): each figure with its baseline and target,
the JSON, the Markdown and the SVG plot (hand-written, as ``bench/report.py`` does: no plotting
dependency). ``python bench/scale_report.py`` renders ``scale.md`` and ``scale.svg`` again from
``scale.json``."""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path
from typing import Any

OPS = {
    "<": lambda v, t: v < t,
    "<=": lambda v, t: v <= t,
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
}


def figure(
    name: str,
    value: float | None,
    unit: str,
    baseline: float | None,
    op: str | None,
    target: float | None,
    baseline_is: str,
    note: str = "",
) -> dict[str, Any]:
    """One figure: ``met`` is ``None`` when it has no target (or no value)."""
    met = None
    if op is not None and target is not None and value is not None:
        met = bool(OPS[op](value, target))
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "target": None if op is None else f"{op} {target:g}",
        "met": met,
        "baseline_is": baseline_is,
        **({"note": note} if note else {}),
    }


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "**NO**"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:,.2f}".rstrip("0").rstrip(".")
        return f"{v:.4f}".rstrip("0").rstrip(".") if v else "0"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown(doc: dict[str, Any]) -> str:
    m, d = doc["machine"], doc["details"]
    lines = [
        "## Dispatch at scale",
        "",
        f"{doc['when']}, {doc['seconds']} s, `{doc['command']}`; Python {m['python']}, "
        f"{m['cpus']} CPUs, load average (1/5/15 min) {m['load_average_before']} before and "
        f"{m['load_average_after']} after (a shared machine); placement: {doc['placement']}.",
        "",
        f"PostgreSQL {d['postgresql']['version']} at its default settings (fsync "
        f"{d['postgresql']['fsync']}, synchronous_commit {d['postgresql']['synchronous_commit']}, "
        f"shared_buffers {d['postgresql']['shared_buffers']}); set: "
        + ", ".join(f"`{k} = {v}`" for k, v in d["postgresql"]["set"].items())
        + " (pg_stat_statements counts the SQL statements).",
        "",
        f"Targets met: {sum(f['met'] is True for f in doc['figures'])} of "
        f"{sum(f['met'] is not None for f in doc['figures'])}.",
        "",
        "| figure | value | unit | baseline | baseline is | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in doc["figures"]:
        met = {True: "met", False: "**NOT met**", None: "-"}[f["met"]]
        target = f["target"] or "-"
        if f.get("note"):
            target += f" ({f['note']})"
        lines.append(
            f"| {f['name']} | {_fmt(f['value'])} | {f['unit']} | {_fmt(f['baseline'])} | "
            f"{f['baseline_is']} | {target} | {met} |"
        )
    lines += ["", "### Probe (trigger every 2 s, during and after the fill)", ""]
    lines += [
        "| probe | path | samples | p50 s | p90 s | p99 s | max s | p50 / p99 during fill | "
        "p50 / p99 after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, p in d["probe"].items():
        lines.append(
            f"| {name} (wait={p['wait']}) | {p['path']} | {p['samples']} | {_fmt(p['p50_s'])} | "
            f"{_fmt(p['p90_s'])} | {_fmt(p['p99_s'])} | {_fmt(p['max_s'])} | "
            f"{_fmt(p['during_fill']['p50_s'])} / {_fmt(p['during_fill']['p99_s'])} "
            f"({p['during_fill']['samples']}) | {_fmt(p['after_fill']['p50_s'])} / "
            f"{_fmt(p['after_fill']['p99_s'])} ({p['after_fill']['samples']}) |"
        )
    lines += [
        "",
        f"Bare Celery publish-to-start in the same worker: p50 {d['publish_to_start']['p50_s']} s, "
        f"p99 {d['publish_to_start']['p99_s']} s.",
    ]
    tp = d["throughput"]
    lines += ["", "### Throughput (one prefork process, --concurrency 1)", ""]
    lines += [
        "| run | runs | runs/s | ratio to bare | Redis client commands/run | SQL statements/run "
        "| transactions/run | new PG sessions/run (by whom, in the run) | "
        "worker CPU µs/run (by thread) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def row(label: str, r: dict[str, Any]) -> None:
        cpu = ", ".join(f"{k} {_fmt(v)}" for k, v in r["worker_cpu_us_per_run"].items() if v)
        who = ", ".join(f"{k} {v}" for k, v in r.get("pg_sessions_by_process", {}).items())
        lines.append(
            f"| {label} | {r['runs']:,} | {_fmt(r['runs_per_second'])} | "
            f"{_fmt(r.get('ratio'))} | {_fmt(r['store_client_commands_per_run']['total'])} | "
            f"{_fmt(r['sql_statements_per_run'])} | {_fmt(r['sql_transactions_per_run'])} | "
            f"{_fmt(r['pg_sessions_per_run'])} ({who}) | {cpu} |"
        )

    for store in ("redis", "database"):
        bares = tp["bare"][store]
        for i, b in enumerate(bares):
            row(f"bare ({store} worker) {i + 1}", b)
            if i < len(tp[store]):
                row(f"debounced, {store} store, {i + 1}", tp[store][i])
    row("debounced, database store, without CELERY_DB_REUSE_MAX", tp["database_without_reuse"])
    warned = tp["database_without_reuse"].get("worker_warned")
    lines += [
        "",
        "The worker without `CELERY_DB_REUSE_MAX` warned about it at start: "
        f"{_fmt(warned) if warned is not None else '-'}.",
    ]
    for store in ("redis", "database"):
        top = tp[store][0]["sql_top"][:6] if tp[store] else []
        if top:
            title = f"SQL per run of the {store} store's first round (pg_stat_statements):"
            lines += ["", title, ""]
            lines += ["| calls/run | ms/run | statement |", "|---|---|---|"]
            n = tp[store][0]["runs"]
            for t in top:
                q = t["query"].replace("|", "\\|")
                lines.append(f"| {t['calls'] / n:.3f} | {t['ms'] / n:.3f} | `{q}` |")
    lines += ["", "### Backlog (flights due while no worker ran, then one started)", ""]
    lines += [
        "| store | flights | messages | per flight | drain runs/s | worker start → first run s |"
        " runs after the last | queue depth max | worker CPU µs/run (by thread) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for store, b in d["backlog"].items():
        lines.append(
            f"| {store} | {b['flights']:,} | {b['messages_published']:,} | "
            f"{b['messages_per_flight']} | {_fmt(b['runs_per_second'])} | "
            f"{b['worker_start_to_first_run_seconds']} | {b['runs_after_the_last']} | "
            f"{b.get('queue', {}).get('max_depth', '-')} | "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in b["worker_cpu_us_per_run"].items() if v)
            + " |"
        )
    r = d.get("restart")
    if r:
        lines += ["", "### Redis restarted empty with flights pending", ""]
        lines.append(
            f"{r['flights']:,} flights of `wait={r['wait_s']:g}` on the Redis store "
            f"({r['triggered_twice']:,} of them triggered twice, the second trigger merged in "
            f"their counter; {r['counters_in_redis_before_restart']:,} keys in Redis), made in "
            f"{r['fill_seconds']} s with a worker (`--concurrency 1`) running; the store's "
            f"Redis killed and started again empty {r['restarted_before_first_due_s']} s before "
            f"the first came due. Runs: {r['runs']:,} of {r['distinct_keys_run']:,} keys "
            f"(never ran: {r['never_ran']}, ran twice: {r['ran_twice']}); start after the last "
            f"trigger + wait: p50 {r['lateness_after_wait_p50_s']} s, p99 "
            f"{r['lateness_after_wait_p99_s']} s, max {r['lateness_after_wait_max_s']} s "
            f"(bound {r['bound_s']} s = 1.2 x {r['flights']:,} / {r['drain_rate_runs_per_second']}"
            f" runs/s); drained at {r['drain_runs_per_second']} runs/s, the last run "
            f"{r['last_run_after_restart_s']} s after the restart; broker queue depth max "
            f"{r['queue']['max_depth']}."
        )
    c = d.get("cluster")
    if c:
        lines += ["", "### Redis Cluster (3 masters), one idle worker", ""]
        lines += ["| node | counters | commands in the window | per pump tick | by command |"]
        lines += ["|---|---|---|---|---|"]
        for node, v in c["nodes"].items():
            by = ", ".join(f"{k} {n}" for k, n in sorted(v["by_command"].items())) or "-"
            lines.append(
                f"| {node} | {v['counters']:,} | {v['commands']} | {v['commands_per_tick']} "
                f"| {by} |"
            )
        lines.append(
            f"\n{c['seconds']} s, at most {c['ticks_at_most']} pump ticks; SQL statements per "
            f"second: {c['sql_statements_per_second']}."
        )
    lines += ["", "### Idle workers and the pump tick", ""]
    lines += [
        "| | Redis commands/s/worker | by command (total) | SQL/s/worker | "
        "new PG sessions/s/worker (by thread, total) |"
    ]
    lines += ["|---|---|---|---|---|"]
    idle_rows = [("idle_1k", "1 worker, 1,000 keys"), ("idle_1", "1 worker, full scale"),
                 ("idle_3", "3 workers, full scale")]  # fmt: skip
    for n in d.get("idle_by_tasks", {}):
        idle_rows.append((n, f"1 worker, {n} registered debounced task(s)"))
    for key, label in idle_rows:
        i = d[key] if key in d else d["idle_by_tasks"][key]
        by = ", ".join(f"{k} {v}" for k, v in sorted(i["redis_by_command"].items()))
        lines.append(
            f"| {label} | {i['redis_commands_per_worker_per_second']} | {by} | "
            f"{i['sql_statements_per_worker_per_second']} | "
            f"{i['pg_sessions_per_worker_per_second']} "
            f"({', '.join(f'{k} {v}' for k, v in i.get('pg_sessions_by_thread', {}).items())}) |"
        )
    for key, label in (("pump_1k", "1,000 keys"), ("pump_full", "full scale")):
        r = d[key]
        lines.append(
            f"\nPump tick (`Pump().tick()`, {r.get('tasks')} tasks, nothing due) at {label}: "
            f"median {r['median_ms']} ms (min {r.get('min_ms')}, "
            f"p90 {r['p90_ms']}, max {r['max_ms']}) over {r['ticks']} ticks, of which this "
            f"thread's CPU {r.get('cpu_median_ms')} ms (median); {r['redis_commands_per_tick']} "
            f"Redis commands and {r['sql_statements_per_tick']} SQL statements per tick, "
            f"{r.get('sql_server_ms_per_tick')} ms of SQL execution on the server."
        )
    sr = d["sizes_redis"]
    lines += [
        "",
        "### Sizes",
        "",
        f"A pending `debounced_task` key's counter: `{json.dumps(sr['sample_counter'])}` "
        f"(TTL {sr.get('sample_ttl_s')} s); {sr['counters_sampled']} of {sr['keys_sampled']} "
        f"sampled keys had one, mean {sr['counter_bytes_mean']} bytes, max "
        f"{sr['counter_bytes_max']}; the due index is in the database. Receiver key made by a "
        f"save: `{json.dumps(d['sizes_receiver_saved']['sample_counter'])}`; made by "
        f"trigger_many: `{json.dumps(d['sizes_receiver']['sample_counter'])}`.",
        "",
        f"Worker memory before the fill: {d['worker_memory_before']}; after: "
        f"{d['worker_memory_after']} (KiB). Broker at the end of the fill: {d['outstanding']}.",
    ]
    prof = d.get("profiles") or {}
    if prof:
        lines += ["", "### Profiles (cProfile in the benchmark process: read the shares)", ""]
        lines.append(
            "A run's store work in-process (`task.fire(key_hash, None, in_worker=False)`: the "
            "claim, the empty body, the finish), unprofiled: "
            + ", ".join(
                f"{k.split('_')[1]} store {v} µs per run"
                for k, v in prof.items()
                if k.endswith("_unprofiled_us_per_run")
            )
            + "."
        )
        for name, p in prof.items():
            if not isinstance(p, dict):
                continue
            lines += ["", f"`{name}`: {p['wall_ms_profiled']} ms profiled", ""]
            lines += ["| own time ms | share | calls | function |", "|---|---|---|---|"]
            lines += [
                f"| {r['ms']} | {r['share']:.1%} | {r['calls']:,} | `{r['function']}` |"
                for r in p["own_time"][:8]
            ]
            lines += ["", "| this app, cumulative ms | share | calls | function |"]
            lines += ["|---|---|---|---|"]
            lines += [
                f"| {r['ms']} | {r['share']:.1%} | {r['calls']:,} | `{r['function']}` |"
                for r in p["app_cumulative"][:8]
            ]
    return "\n".join(lines) + "\n"


def svg(doc: dict[str, Any]) -> str:
    """Three panels: each targeted figure's headroom (log scale, 1 = the target); the probe's
    trigger-to-start latency over the run (the fill shaded); runs per second of every
    throughput and backlog run."""
    d = doc["details"]
    width, left, right = 1100, 470, 30
    plot_w = width - left - right
    targeted = [f for f in doc["figures"] if f["met"] is not None]
    bar_h = 16
    h1 = 40 + len(targeted) * (bar_h + 4)
    h2, h3 = 260, 240
    height = h1 + h2 + h3 + 260
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        '<text x="10" y="20" font-size="13" font-weight="bold">Figures against their targets '
        "(headroom: value / target, or target / value for upper bounds; log scale; the line "
        "is the target)</text>",
    ]
    lo, hi = -1.0, 1.0  # 0.1x .. 10x

    def x_of(r: float) -> float:
        v = min(max(math.log10(r) if r > 0 else lo, lo), hi)
        return left + (v - lo) / (hi - lo) * plot_w

    for e in (-1, 0, 1):
        xx = x_of(10.0**e)
        parts.append(
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="30" y2="{h1}" '
            f'stroke="{"black" if e == 0 else "#ddd"}"/>'
        )
        parts.append(f'<text x="{xx:.1f}" y="{h1 + 12}" text-anchor="middle">{10.0**e:g}x</text>')
    for i, f in enumerate(targeted):
        y = 36 + i * (bar_h + 4)
        op, t = f["target"].split()
        t, v = float(t), float(f["value"])
        if t == 0:
            r = 10.0 if f["met"] else 0.1
        elif op.startswith(">"):
            r = v / t
        else:
            r = t / v if v else 10.0
        color = "#43a047" if f["met"] else "#e53935"
        x0, x1 = x_of(1.0), x_of(r)
        parts.append(
            f'<rect x="{min(x0, x1):.1f}" y="{y}" width="{abs(x1 - x0):.1f}" height="{bar_h}" '
            f'fill="{color}"><title>{escape(f["name"])}: {v:g} {escape(f["unit"])} '
            f"(target {escape(f['target'])})</title></rect>"
        )
        label = f["name"] if len(f["name"]) <= 80 else f["name"][:79] + "…"
        parts.append(f'<text x="{left - 6}" y="{y + 12}" text-anchor="end">{escape(label)}</text>')
    # -- probe latency over time
    y0 = h1 + 50
    parts.append(
        f'<text x="10" y="{y0 - 14}" font-size="13" font-weight="bold">Probe: trigger-to-start '
        "latency (s) over the run; the fill is shaded</text>"
    )
    probes = d["probe"]
    t0 = min((p["series"][0][0] for p in probes.values() if p["series"]), default=0.0)
    t1 = max((p["series"][-1][0] for p in probes.values() if p["series"]), default=1.0)
    ymax = max((s[1] for p in probes.values() for s in p["series"]), default=1.0)
    ymax = max(4.0, math.ceil(ymax))
    span = max(t1 - t0, 1.0)

    def px(t: float) -> float:
        return left + (t - t0) / span * plot_w

    def py(v: float) -> float:
        return y0 + h2 - min(v, ymax) / ymax * h2

    fs, fe = d["fill_window"]
    parts.append(
        f'<rect x="{px(max(fs, t0)):.1f}" y="{y0}" width="{px(min(fe, t1)) - px(max(fs, t0)):.1f}" '
        f'height="{h2}" fill="#fff3e0"/>'
    )
    for v in range(0, int(ymax) + 1):
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{py(v):.1f}" y2="{py(v):.1f}" '
            'stroke="#eee"/>'
        )
        parts.append(f'<text x="{left - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v}</text>')
    colors = ["#1e88e5", "#90caf9", "#43a047", "#a5d6a7"]
    for j, (name, p) in enumerate(sorted(probes.items(), key=lambda kv: kv[0][-5:])):
        c = colors[j % len(colors)]
        for at, lat in p["series"]:
            parts.append(f'<circle cx="{px(at):.1f}" cy="{py(lat):.1f}" r="1.6" fill="{c}"/>')
        ly = y0 + h2 + 34 + j * 14
        parts.append(f'<rect x="{left + 8}" y="{ly - 8}" width="10" height="10" fill="{c}"/>')
        parts.append(
            f'<text x="{left + 22}" y="{ly + 1}">{escape(name)} (wait={p["wait"]}, {p["path"]}'
            f"): p50 {p['p50_s']} s, p99 {p['p99_s']} s</text>"
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{y0 + h2 + 16}" text-anchor="middle">'
        f"{span:,.0f} s</text>"
    )
    # -- throughput
    y0 = h1 + h2 + 170
    parts.append(
        f'<text x="10" y="{y0 - 14}" font-size="13" font-weight="bold">Runs per second, one '
        "prefork process (bare Celery task, debounced empty body, backlog drain)</text>"
    )
    tp = d["throughput"]
    bars: list[tuple[str, float, str]] = []
    for store, color in (("redis", "#1e88e5"), ("database", "#43a047")):
        for i, b in enumerate(tp["bare"][store]):
            bars.append((f"bare {i + 1}", b["runs_per_second"], "#9e9e9e"))
            if i < len(tp[store]):
                bars.append((f"{store} {i + 1}", tp[store][i]["runs_per_second"], color))
        bars.append((f"{store} backlog", d["backlog"][store]["runs_per_second"], color))
    bars.append(("database, no reuse", tp["database_without_reuse"]["runs_per_second"], "#a5d6a7"))
    top = max(b[1] for b in bars) * 1.1
    bw = plot_w / len(bars)
    for i, (label, v, c) in enumerate(bars):
        x = left + i * bw
        hh = v / top * h3
        parts.append(
            f'<rect x="{x + 2:.1f}" y="{y0 + h3 - hh:.1f}" width="{bw - 4:.1f}" height="{hh:.1f}" '
            f'fill="{c}"><title>{escape(label)}: {v:,.0f} runs/s</title></rect>'
        )
        parts.append(
            f'<text x="{x + bw / 2:.1f}" y="{y0 + h3 - hh - 3:.1f}" text-anchor="middle" '
            f'font-size="9">{v:,.0f}</text>'
        )
        parts.append(
            f'<text transform="translate({x + bw / 2 + 3:.1f},{y0 + h3 + 8}) rotate(45)" '
            f'font-size="9">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write(out: Path, meta: dict[str, Any], figures: list[dict[str, Any]], details: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {**meta, "figures": figures, "details": details}
    (out / "scale.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    text = markdown(doc)
    (out / "scale.md").write_text(text)
    (out / "scale.svg").write_text(svg(doc))
    print(text)


if __name__ == "__main__":  # render scale.md and scale.svg again from scale.json
    results = Path(__file__).resolve().parent / "results"
    document = json.loads((results / "scale.json").read_text())
    (results / "scale.md").write_text(markdown(document))
    (results / "scale.svg").write_text(svg(document))
