"""``manage.py debounce_status``: a table of pending and running keys (``--json`` for machines)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from django_debounce.backends import get_backend
from django_debounce.models import DebounceKey


class Command(BaseCommand):
    help = "Show pending and running debounce keys, with live pending counts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON lines")
        parser.add_argument("--task", metavar="NAME", help="only keys of this task")
        parser.add_argument("--limit", type=int, default=100, help="at most this many keys")

    def handle(self, *args: Any, **options: Any) -> None:
        qs = DebounceKey.objects.active().order_by("due_at", "pk")
        if options["task"]:
            qs = qs.filter(task_name=options["task"])
        rows = list(qs[: options["limit"]])
        try:
            live = get_backend().pending_counts([r.key_hash for r in rows])
        except Exception:  # Redis down: show the durable record
            live = {}
        now = timezone.now()
        records = []
        for r in rows:
            due = (r.due_at - now).total_seconds() if r.due_at else None
            records.append(
                {
                    "task": r.task_name,
                    "key": r.key,
                    "state": r.state,
                    "pending": live.get(r.key_hash, r.pending),
                    "flight_id": r.flight_id,
                    "due_in_s": round(due, 3) if due is not None else None,
                    "lease_until": r.running_until.isoformat() if r.running_until else None,
                    "store": r.store,
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
            self.stdout.write("no pending or running keys")
            return
        header = ("task", "key", "state", "pending", "due in", "runs", "merged")
        table = [header] + [
            (
                rec["task"],
                rec["key"][:60],
                rec["state"],
                str(rec["pending"]),
                "-" if rec["due_in_s"] is None else f"{rec['due_in_s']:.1f}s",
                str(rec["runs"]),
                str(rec["merged"]),
            )
            for rec in records
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
