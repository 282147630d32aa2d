"""The row every contender's saves touch, and one proxy per contender.

All contenders save rows of one table (``BenchDoc``) with the same ``UPDATE``; the proxies only
give each contender its own ``post_save`` sender, so a save reaches that contender's receiver
and no other. ``version`` is the number of the save; ``job_ms`` is how long the job sleeps.
"""

from django.db import models


class BenchDoc(models.Model):
    """One key of a scenario: a row saved many times."""

    contender = models.CharField(max_length=32)
    scenario = models.CharField(max_length=8)
    version = models.PositiveIntegerField(default=0)
    job_ms = models.PositiveIntegerField(default=30)

    def __str__(self) -> str:
        return f"{self.contender}/{self.scenario} {self.pk} v{self.version}"


class NoopDoc(BenchDoc):
    """Saves with no receiver: the cost of the save alone."""

    class Meta:
        proxy = True


class PerSaveDoc(BenchDoc):
    """A Celery task per save (``.delay()``)."""

    class Meta:
        proxy = True


class CounterDoc(BenchDoc):
    """The counter pattern: ``INCR`` plus ``apply_async(countdown=wait)`` per save."""

    class Meta:
        proxy = True


class OnceDoc(BenchDoc):
    """celery-once's ``QueueOnce``."""

    class Meta:
        proxy = True


class SingletonDoc(BenchDoc):
    """celery-singleton's ``Singleton``."""

    class Meta:
        proxy = True


class RedisStoreDoc(BenchDoc):
    """This app, ``@debounced_receiver(backend="redis")``."""

    class Meta:
        proxy = True


class DatabaseStoreDoc(BenchDoc):
    """This app, ``@debounced_receiver(backend="database")`` (PostgreSQL)."""

    class Meta:
        proxy = True
