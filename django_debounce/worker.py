"""What django-debounce adds to a Celery worker: a bootstep that runs the pump and the lease
keeper in the worker's main process, added by ``apps.DebounceConfig.ready`` through Celery's
``celeryd_init`` signal (docs/operations.md, "The worker": when it starts and stops)."""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from django_debounce import conf, runtable
from django_debounce.keeper import LeaseKeeper
from django_debounce.pump import Pump, stats

logger = logging.getLogger("django_debounce")

# Pools whose runs the lease keeper can stop one at a time when their lease cannot be renewed.
TERMINABLE_POOLS = ("prefork", "processes")


def pool_name(worker: Any) -> str:
    """The name of a worker's pool class (``prefork``, ``threads``, ``solo``, ...)."""
    pool = worker.pool_cls
    return str(pool if isinstance(pool, str) else pool.__module__).rsplit(".", 1)[-1]


class DebounceStep(bootsteps.StartStopStep):
    """Runs the pump (unless ``DEBOUNCE_PUMP`` is false) and the lease keeper
    in the worker's main process."""

    requires = {"celery.worker.components:Pool"}
    label = "django-debounce"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        self.pump: Any = None
        self.keeper: Any = None
        if pool_name(worker) in TERMINABLE_POOLS:
            # Before the pool forks (steps are created before any starts): every pool
            # process, replacements included, inherits the run table.
            size = max(worker.concurrency or 0, getattr(worker, "max_concurrency", 0) or 0)
            runtable.install(max(64, 4 * size))

    def start(self, worker: Any) -> None:
        self._warn(worker)
        self.keeper = LeaseKeeper()
        self.keeper.start()
        if conf.get("PUMP"):
            self.pump = Pump(app=worker.app)
            self.pump.start()
        else:
            logger.info("django_debounce: DEBOUNCE_PUMP is off: this worker runs no pump")

    def stop(self, worker: Any) -> None:
        for part in (self.pump, self.keeper):
            if part is not None:
                part.stop()

    def _warn(self, worker: Any) -> None:
        name = pool_name(worker)
        if name not in TERMINABLE_POOLS:
            logger.warning(
                "django_debounce: the %s pool cannot stop one run: a debounced body that "
                "holds the GIL or never yields can keep the lease keeper from renewing its "
                "lease, and a run whose lease cannot be renewed (the store unreachable) is "
                "not stopped before it is redone. Use the prefork pool for debounced tasks.",
                name,
            )
        if db_reuse_max(worker.app) is None:
            logger.warning(
                "django_debounce: CELERY_DB_REUSE_MAX is not set: Celery's Django fixup "
                "closes the database connections around every task, so each debounced run "
                "opens a new one. Set CELERY_DB_REUSE_MAX (e.g. 1000) in your Django settings."
            )


def db_reuse_max(app: Any) -> Any:
    """``CELERY_DB_REUSE_MAX`` as Celery's Django fixup of ``app`` read it (``None``: unset,
    or no Django fixup)."""
    for fixup in getattr(app, "_fixups", None) or ():
        worker_fixup = getattr(fixup, "_worker_fixup", None)
        if worker_fixup is not None:
            return getattr(worker_fixup, "db_reuse_max", None)
    return app.conf.get("CELERY_DB_REUSE_MAX")


def register_control() -> None:
    """Register the ``debounce_stats`` remote control command (``celery inspect`` style):
    what this worker's pump did (``debounce_status --pumps`` asks every worker)."""
    from celery.worker.control import inspect_command

    @inspect_command(name="debounce_stats")  # type: ignore[misc]
    def debounce_stats(state: Any, **kwargs: Any) -> dict[str, Any]:
        """django-debounce: the pump's published and re-taken counts and tick time."""
        with stats.lock:
            return {
                "published": stats.published,
                "taken_again": stats.again,
                "released": stats.released,
                "ticks": stats.ticks,
                "last_tick_seconds": round(stats.last_tick_seconds, 6),
                "capped_queues": sorted(stats.capped),
                "pump": bool(conf.get("PUMP")),
            }


def add_step(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    """Celery ``celeryd_init`` hook: add ``DebounceStep`` to the worker's blueprint."""
    app = getattr(instance, "app", None)
    if app is not None:
        app.steps["worker"].add(DebounceStep)
        register_control()
