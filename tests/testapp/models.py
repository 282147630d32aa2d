import uuid

from django.db import models


class Item(models.Model):
    name = models.CharField(max_length=100, default="")
    value = models.IntegerField(default=0)


class OtherItem(models.Model):
    value = models.IntegerField(default=0)


class RunLog(models.Model):
    """One row per execution of a test task body, written by the worker processes."""

    task = models.CharField(max_length=200)
    key = models.TextField(blank=True, default="")
    tag = models.TextField(blank=True, default="")
    payload = models.JSONField(null=True)
    value_seen = models.IntegerField(null=True)
    triggers = models.IntegerField(null=True)
    flight_id = models.IntegerField(null=True)
    run_id = models.IntegerField(null=True)
    pid = models.IntegerField()
    started = models.FloatField()
    finished = models.FloatField(null=True)


class Doc(models.Model):
    """Saved by the on-commit tests; its receiver coalesces (wait 0): a worker is ready at once."""

    value = models.IntegerField(default=0)


class Batchy(models.Model):
    """Saved by the collect tests; its receiver collects rows (collect=True)."""

    value = models.IntegerField(default=0)


class Ticket(models.Model):
    """A row with a UUID primary key: its receiver gets the pk as a ``uuid.UUID``."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    title = models.CharField(max_length=50, default="")
