"""``manage.py debounce_status``: a table of pending and running keys (``--json`` for machines)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_debounce import dbtime, display, live
from django_debounce.management.commands._common import (
    MAX_LIMIT,
    add_database_argument,
    debounce_tables,
    limit,
    limit_error,
)
from django_debounce.models import DebounceKey
from django_debounce.observe import index_stats


class Command(BaseCommand):
    help = (
        "Show pending and running debounce keys, with live counts (read from Redis for the "
        "keys the Redis store holds)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object per key")
        parser.add_argument("--task", metavar="NAME", help="only keys of this task (Celery name)")
        parser.add_argument(
            "--key",
            metavar="TEXT",
            help="one key, by its readable text (as the admin shows it), whatever its state",
        )
        parser.add_argument(
            "--limit",
            type=limit,
            default=100,
            metavar="N",
            help=f"at most N keys (default 100, at most {MAX_LIMIT:,})",
        )
        parser.add_argument(
            "--index",
            action="store_true",
            help="the due index per task instead: depth, entries due now, age of the oldest",
        )
        add_database_argument(parser)
        parser.add_argument(
            "--pumps",
            action="store_true",
            help="ask every worker's pump what it published (Celery remote control, 2 s)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        given = options["limit"]  # call_command(limit=...) skips the argparse type
        if isinstance(given, bool) or not isinstance(given, int) or not 1 <= given <= MAX_LIMIT:
            raise CommandError(limit_error(given))
        with debounce_tables(options) as alias:
            if options["index"]:
                return self._index(options)
            if options["pumps"]:
                return self._pumps(options)
            self._keys(alias, options)

    def _keys(self, alias: str, options: dict[str, Any]) -> None:
        keys = DebounceKey.objects.using(alias)
        if options["key"] is not None:
            qs = keys.filter(key=options["key"]).order_by("task_name", "pk")
        else:
            qs = keys.active().order_by("due_at", "pk")
        if options["task"]:
            qs = qs.filter(task_name=options["task"])
        rows = list(qs[: options["limit"] + 1])
        more = len(rows) > options["limit"]
        rows = rows[: options["limit"]]
        live.refresh(rows)
        now = dbtime.now()
        records = []
        for r in rows:
            due = (r.due_at - now).total_seconds() if r.due_at else None
            records.append(
                {
                    "task": r.task_name,
                    "key": r.key,
                    "state": r.state,
                    "pending": r.live_pending,  # type: ignore[attr-defined]
                    "flight_id": r.flight_id,
                    "due_in_s": round(due, 3) if due is not None else None,
                    "fires": display.fire_time(r, now),
                    "lease_until": r.running_until.isoformat() if r.running_until else None,
                    "triggers": r.triggers,
                    "runs": r.runs,
                    "merged": r.merged,
                }
            )
        if options["json"]:
            for rec in records:
                self.stdout.write(json.dumps(rec, ensure_ascii=False))
            return
        if not records:
            self.stdout.write(
                f"no key {options['key']!r}"
                if options["key"] is not None
                else "no pending or running keys"
            )
            return
        header = ("task", "key", "state", "pending", "fires", "triggers", "runs", "merged")
        table: list[tuple[str, ...]] = [header]
        for rec in records:  # a long key or task name cut, so the columns stay readable
            key, task = display.cut(rec["key"], 60), display.cut(rec["task"], 40)
            cells = {**rec, "key": key, "task": task, "fires": rec["fires"] or "-"}
            table.append(tuple(str(cells[column]) for column in header))
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
        if more:
            self.stdout.write(
                f"(the first {options['limit']} keys by due time; more are pending or running: "
                "raise --limit to see them)"
            )

    def _index(self, options: dict[str, Any]) -> None:
        stats = index_stats()
        if options["task"]:
            stats = {k: v for k, v in stats.items() if k == options["task"]}
        if not options["json"]:
            self.stdout.write(f"{'task':40}  {'depth':>9}  {'due now':>9}  oldest due")
        for name, st in sorted(stats.items()):
            if options["json"]:
                age_s = round(st.oldest_due_age, 3)
                row = {"task": name, "depth": st.depth, "due": st.due, "oldest_due_age_s": age_s}
                self.stdout.write(json.dumps(row))
            else:
                age = f"{st.oldest_due_age:.1f} s late" if st.due else "-"
                self.stdout.write(f"{name:40}  {st.depth:>9}  {st.due:>9}  {age}")

    def _pumps(self, options: dict[str, Any]) -> None:
        from celery import current_app

        replies = current_app.control.broadcast("debounce_stats", reply=True, timeout=2.0) or []
        if options["json"]:
            for reply in replies:
                for worker, st in reply.items():
                    self.stdout.write(json.dumps({"worker": worker, **st}))
            return
        if not replies:
            self.stdout.write("no worker answered (is one running, with remote control on?)")
            return
        for reply in replies:
            for worker, st in reply.items():
                self.stdout.write(
                    f"{worker}: published {st['published']}, taken again {st['taken_again']}, "
                    f"released {st['released']}, {st['ticks']} ticks, last tick "
                    f"{st['last_tick_seconds'] * 1000:.1f} ms"
                    + (" (pump off)" if not st["pump"] else "")
                )
