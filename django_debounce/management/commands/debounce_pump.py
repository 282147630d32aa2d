"""``manage.py debounce_pump``: run a pump on its own, outside any worker."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand

from django_debounce import registry
from django_debounce.pump import Pump, stats


class Command(BaseCommand):
    help = (
        "Publish the dispatch messages of due flights from the due index, until stopped "
        "(SIGINT/SIGTERM). Workers run a pump each unless DEBOUNCE_PUMP is False; this runs "
        "one on its own, e.g. beside workers started with the pump turned off."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--once", action="store_true", help="one pass over what is due now, then exit"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tasks = registry.all_tasks()
        if not tasks:
            self.stderr.write(
                "No debounced task is registered in this process: import the Celery app "
                "(your project's celery.py) so that its tasks are registered."
            )
        pump = Pump()
        if options["once"]:
            pump.tick()
            self.stdout.write(f"published {stats.published} message(s)")
            return
        done = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: done.set())
        self.stdout.write(f"pumping {len(tasks)} debounced task(s); SIGINT or SIGTERM stops")
        pump.start()
        done.wait()
        pump.stop()
        self.stdout.write(f"stopped; published {stats.published} message(s)")
