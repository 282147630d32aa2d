"""``manage.py debounce_purge``: remove stale idle keys and old run history, recover lost
leases and lost dispatch messages, and print what was (or would be) done."""

from __future__ import annotations

import difflib
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from django_debounce import conf, dbtime, durations
from django_debounce.exceptions import UnknownTask
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.recovery import cancel_unregistered, record_now, recover, registered_names
from django_debounce.tasks import get_debounced_task


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
        if not 1 <= options["batch_size"] <= 100_000:
            raise CommandError(
                "--batch-size must be an integer from 1 to 100000 (rows per delete), e.g. "
                "--batch-size 1000."
            )
        alias = options["database"]
        if alias and alias not in connections:
            raise CommandError(
                f"--database {alias!r} is not a database alias of this project; use one of: "
                f"{', '.join(connections)}."
            )
        keys = DebounceKey.objects.using(alias) if alias else DebounceKey.objects.all()
        runs = DebounceRun.objects.using(alias) if alias else DebounceRun.objects.all()
        task = options["task"]
        if task:
            known = set(keys.values_list("task_name", flat=True).distinct())
            try:
                get_debounced_task(task)
            except UnknownTask:
                if task not in known:
                    candidates = sorted(known | registered_names())
                    close = difflib.get_close_matches(task, candidates, n=3)
                    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
                    names = ", ".join(candidates[:20]) + (", ..." if len(candidates) > 20 else "")
                    raise CommandError(
                        f"--task {task!r} is neither a registered debounced task nor recorded "
                        f"in the database.{hint} Give the task's Celery name, one of: "
                        f"{names or 'none yet'}."
                    ) from None
            keys, runs = keys.filter(task_name=task), runs.filter(task_name=task)
        # The durable rows of Redis-held keys lag the live state by the records no recorder
        # wrote yet (none runs in this process): write them before reading the rows. That
        # changes no debounce state, so a dry run does it too.
        record_now()
        now = dbtime.now()
        cutoff = now - age
        dry = options["dry_run"]
        # Recovery covers every key, whatever --task says: the stores recover all at once.
        everything = DebounceKey.objects.using(alias) if alias else DebounceKey.objects.all()
        lost = everything.lease_expired(now).count()
        if dry:
            grace = conf.seconds_of("DISPATCH_GRACE")
            overdue = everything.dispatch_overdue(now, grace).count()
            recovery = (
                f"would redo {lost} runs whose lease ran out and re-dispatch about {overdue} "
                "flights whose message is missing or overdue"
            )
        else:
            recovery = f"redid {lost} runs whose lease ran out; re-dispatched {recover()} flights"
        if options["unregistered"]:
            touched, dropped, orphan_tasks = cancel_unregistered(keys, dry_run=dry)
            if orphan_tasks:
                self.stdout.write(
                    f"{'would drop' if dry else 'dropped'} {dropped} pending triggers on "
                    f"{touched} keys of tasks that are not registered debounced tasks here: "
                    f"{', '.join(orphan_tasks)}"
                )
        else:
            orphans = keys.active().exclude(task_name__in=registered_names())
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
            + f" [database {alias or DEFAULT_DB_ALIAS}]"
        )
