"""``base=``: a plain ``celery.Task`` subclass is mixed in after ``DebouncedTask`` (its
attributes and methods reach the body, debouncing still works); one the run machinery would
bypass (``__call__``, ``run``) and anything not a Task are refused at decoration."""

from __future__ import annotations

import pytest
from celery import Task
from django.core.exceptions import ImproperlyConfigured
from django.db.models.signals import post_save

from django_debounce import debounced_receiver, debounced_task
from django_debounce.receivers import DebouncedReceiverTask
from django_debounce.tasks import DebouncedTask
from tests.testapp.models import OtherItem

seen: list[tuple] = []


class Audited(Task):
    """A base as projects write them: an attribute, a helper method, a Celery option."""

    abstract = True
    audit_label = "audited"
    max_retries = 7

    def audit(self, value):
        seen.append((self.audit_label, value))


@debounced_task(base=Audited, bind=True, wait=60, name="testapp.audited")
def audited(self, value):
    self.audit(value)


@pytest.mark.django_db(transaction=True)
def test_a_celery_task_base_is_mixed_in_and_runs_debounced(eager, store):
    seen.clear()
    assert isinstance(audited, DebouncedTask) and isinstance(audited, Audited)
    assert audited.max_retries == 7
    audited.trigger(1)
    audited.trigger(2)
    assert audited.flush(2) is True and audited.flush(1) is True
    assert seen == [("audited", 2), ("audited", 1)]


def test_a_receiver_takes_a_base_too():
    def handler(sender, **kwargs):
        return None

    task = debounced_receiver(
        post_save, sender=OtherItem, base=Audited, name="testapp.audited_receiver"
    )(handler)
    assert isinstance(task, DebouncedReceiverTask) and isinstance(task, Audited)
    post_save.disconnect(dispatch_uid="django_debounce:testapp.audited_receiver", sender=OtherItem)


def test_a_debounced_task_subclass_is_used_as_given():
    class Mine(DebouncedTask):
        abstract = True

    def mine(x):
        return x

    task = debounced_task(base=Mine, name="testapp.mine_base")(mine)
    assert isinstance(task, Mine) and task.__class__.__mro__[1] is Mine  # not mixed again


class WrapsCall(Task):
    abstract = True

    def __call__(self, *args, **kwargs):
        return self.run(*args, **kwargs)


@pytest.mark.parametrize(
    "base, text",
    [
        (WrapsCall, "defines __call__"),
        (type("Sub", (WrapsCall,), {}), "in WrapsCall"),
        (object, "must be a celery.Task subclass"),
        ("tasks.Base", "must be a celery.Task subclass"),
    ],
)
def test_a_base_the_run_would_bypass_is_refused_naming_the_fix(base, text):
    with pytest.raises(ImproperlyConfigured, match=text):
        debounced_task(base=base, name="testapp.refused_base")(lambda x: None)
