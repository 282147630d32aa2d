"""``manage.py debounce_purge``: remove stale idle keys and old run history, recover lost
leases and lost dispatch messages, and print what was (or would be) done."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS
from django.utils import timezone

from django_debounce import durations
from django_debounce.exceptions import UnknownTask
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.recovery import recover
from django_debounce.tasks import get_debounced_task


class Command(BaseCommand):
    help = (
        "Delete idle debounce keys and run history older than --older-than, in batches; "
        "redo runs whose lease ran out and re-dispatch flights whose message was lost."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="DURATION",
            help=f"age cutoff: {durations.ACCEPTED}",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="print what would be done; change nothing"
        )
        parser.add_argument("--task", metavar="NAME", help="only keys and runs of this task")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=1000,
            metavar="N",
            help="rows deleted per statement (default 1000)",
        )
        parser.add_argument(
            "--database",
            default=None,
            metavar="ALIAS",
            help="database alias of the debounce tables (default: the router's)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            age = durations.parse(options["older_than"])
        except ValueError as exc:
            raise CommandError(f"--older-than: {exc}") from None
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be a positive integer, e.g. --batch-size 1000.")
        alias = options["database"]
        keys = DebounceKey.objects.using(alias) if alias else DebounceKey.objects.all()
        runs = DebounceRun.objects.using(alias) if alias else DebounceRun.objects.all()
        task = options["task"]
        if task:
            known = set(keys.values_list("task_name", flat=True).distinct())
            try:
                get_debounced_task(task)
            except UnknownTask:
                if task not in known:
                    names = ", ".join(sorted(known)[:20]) or "none recorded yet"
                    raise CommandError(
                        f"--task {task!r} is neither a registered debounced task nor recorded "
                        f"in the database. Give the task's Celery name, one of: {names}."
                    ) from None
            keys, runs = keys.filter(task_name=task), runs.filter(task_name=task)
        cutoff = timezone.now() - age
        dry = options["dry_run"]
        recovered = 0 if dry else recover(task)
        batch = options["batch_size"]
        n_runs = runs.delete_expired(cutoff, batch_size=batch, dry_run=dry)
        n_keys = keys.delete_stale(cutoff, batch_size=batch, dry_run=dry)
        verb = "would delete" if dry else "deleted"
        self.stdout.write(
            f"{verb} {n_keys} idle keys and {n_runs} runs older than {cutoff:%Y-%m-%d %H:%M:%S}"
            f" UTC; re-dispatched {recovered} flights"
            + (" (dry run: nothing recovered or deleted)" if dry else "")
            + f" [database {alias or DEFAULT_DB_ALIAS}]"
        )
