"""``manage.py debounce_purge``: remove stale idle keys and old run history, recover lost
leases and lost dispatch messages, and print what was (or would be) done."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_debounce import dbtime, durations, registry
from django_debounce.management.commands._common import add_database_argument, debounce_tables
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.observe import index_stats
from django_debounce.recovery import cancel_unregistered, recover


class Command(BaseCommand):
    help = (
        "Delete idle debounce keys and run history older than --older-than, in batches; "
        "redo runs whose lease ran out and re-dispatch flights whose message was lost "
        "(recovery covers every task; --task limits what is deleted)."
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
        parser.add_argument(
            "--task", metavar="NAME", help="delete only keys and runs of this task (Celery name)"
        )
        parser.add_argument(
            "--unregistered",
            action="store_true",
            help="first drop the pending triggers of keys whose task is no longer a "
            "registered debounced task (removed or renamed), so they are purged too",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=1000,
            metavar="N",
            help="rows deleted per statement (default 1000)",
        )
        add_database_argument(parser, "; recovery always uses the stores' database")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            age = durations.parse(options["older_than"])
        except ValueError as exc:
            raise CommandError(f"--older-than: {exc}") from None
        if not 1 <= options["batch_size"] <= 100_000:
            raise CommandError(
                "--batch-size must be an integer from 1 to 100000 (rows per delete), e.g. "
                "--batch-size 1000."
            )
        with debounce_tables(options) as alias:
            self._purge(alias, age, options)

    def _purge(self, alias: str, age: Any, options: dict[str, Any]) -> None:
        keys = DebounceKey.objects.using(alias).all()
        runs = DebounceRun.objects.using(alias).all()
        task = options["task"]
        if task:
            keys, runs = keys.filter(task_name=task), runs.filter(task_name=task)
        now = dbtime.now()
        cutoff = now - age
        dry = options["dry_run"]
        # Recovery covers every key, whatever --task says: the stores recover all at once. A
        # run whose lease ran out counts as lost, and recovery redoes it.
        lost = DebounceKey.objects.using(alias).filter(running_until__lt=now).count()
        if dry:
            due = sum(stats.due for stats in index_stats().values())
            recovery = (
                f"would redo {lost} runs whose lease ran out and publish {due} flights due "
                "now in the due index (never published, or published more than "
                "DEBOUNCE_DISPATCH_GRACE ago and not claimed)"
            )
        else:
            recovery = f"redid {lost} runs whose lease ran out; published {recover()} flights"
        if options["unregistered"]:
            touched, dropped, orphan_tasks = cancel_unregistered(keys, dry_run=dry)
            if orphan_tasks:
                self.stdout.write(
                    f"{'would drop' if dry else 'dropped'} {dropped} pending triggers on "
                    f"{touched} keys of tasks that are not registered debounced tasks here: "
                    f"{', '.join(orphan_tasks)}"
                )
        else:
            orphans = keys.active().exclude(task_name__in=registry.names())
            orphan_tasks = sorted(set(orphans.values_list("task_name", flat=True)))
            if orphan_tasks:
                self.stdout.write(
                    f"{orphans.count()} keys with pending triggers belong to tasks that are "
                    f"not registered debounced tasks here ({', '.join(orphan_tasks)}): import "
                    "their modules, or add --unregistered to drop their triggers"
                )
        batch = options["batch_size"]
        closed = runs.close_unfinished(cutoff, now, dry_run=dry)
        if closed:
            self.stdout.write(
                f"{'would close' if dry else 'closed'} {closed} runs still marked running "
                "whose finish was never recorded (their key has no live run) as lost"
            )
        n_runs = runs.delete_expired(cutoff, batch_size=batch, dry_run=dry)
        n_keys = keys.delete_stale(cutoff, batch_size=batch, dry_run=dry)
        verb = "would delete" if dry else "deleted"
        self.stdout.write(
            f"{verb} {n_keys} idle keys and {n_runs} runs older than {cutoff:%Y-%m-%d %H:%M:%S}"
            f" UTC; {recovery}"
            + (" (dry run: nothing recovered or deleted)" if dry else "")
            + f" [database {alias}]"
        )
