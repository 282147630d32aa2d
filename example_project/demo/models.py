"""Tables of ``manage.py demo``: one small model per scenario, so each scenario's receiver
sees only its own saves, and ``DemoRun``, one row per execution of a job body in the worker."""

from django.db import models


class DemoDoc(models.Model):
    """A row saved many times in a burst; ``version`` is the number of the save."""

    version = models.PositiveIntegerField(default=0)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{type(self).__name__} {self.pk} v{self.version}"


class PerSaveDoc(DemoDoc):
    """Scenario a: a plain receiver queues one Celery task per save."""


class DebounceDoc(DemoDoc):
    """Scenario b: ``debounced_receiver(wait=0.05)``."""


class CoalesceDoc(DemoDoc):
    """Scenario c: ``debounced_receiver(wait=0)`` (coalesce: one run at a time, one pending)."""


class StreamDoc(DemoDoc):
    """Scenario d: ``debounced_receiver(wait=0.05, max_wait=0.5)`` under a steady stream."""


class DemoRun(models.Model):
    """One execution of a demo job body, written by the worker process that ran it."""

    scenario = models.CharField(max_length=32, db_index=True)
    doc_pk = models.BigIntegerField(null=True)
    version_seen = models.IntegerField(null=True, help_text="version of the row re-read by the job")
    triggers = models.IntegerField(null=True, help_text="debounce.triggers (saves this run covers)")
    started = models.FloatField(help_text="time.time() when the body started")
    finished = models.FloatField(help_text="time.time() when the body ended (0 while it runs)")
    items = models.JSONField(null=True, help_text="the collected items of a batch run")
    pid = models.IntegerField()

    class Meta:
        ordering = ["started"]

    def __str__(self) -> str:
        return f"{self.scenario} run at {self.started:.3f}"


class ModeDoc(DemoDoc):
    """``manage.py demo --modes``: a row whose saves trigger the debounced task of its mode;
    the job sleeps ``job_ms``."""

    mode = models.CharField(max_length=32, db_index=True)
    job_ms = models.PositiveIntegerField(default=30)
