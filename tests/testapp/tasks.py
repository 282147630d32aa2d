"""Debounced tasks and receivers the tests drive through real worker processes."""

import os
import time

from django.db.models.signals import post_save

from django_debounce import RunInfo, debounced_receiver, debounced_task
from tests.testapp.models import Doc, Item, OtherItem, RunLog


def _log(task: str, tag: str, debounce: RunInfo | None, **fields) -> RunLog:
    return RunLog.objects.create(
        task=task,
        tag=tag,
        key=debounce.key if debounce else "",
        triggers=debounce.triggers if debounce else None,
        flight_id=debounce.flight_id if debounce else None,
        run_id=debounce.run_id if debounce else None,
        pid=os.getpid(),
        started=time.time(),
        **fields,
    )


def _body(task: str, tag: str, sleep: float, debounce: RunInfo | None, payload=None) -> None:
    log = _log(task, tag, debounce, payload=payload)
    if sleep:
        time.sleep(sleep)
    log.finished = time.time()
    log.save(update_fields=["finished"])


@debounced_task(wait=0.3, name="testapp.record")
def record(tag: str, sleep: float = 0.0, note: str = "", *, debounce: RunInfo) -> None:
    _body("testapp.record", tag, sleep, debounce, payload={"note": note})


@debounced_task(wait=5, name="testapp.record_slow")
def record_slow(tag: str, *, debounce: RunInfo) -> None:
    _body("testapp.record_slow", tag, 0, debounce)


@debounced_task(wait=0.3, name="testapp.record_other")
def record_other(tag: str, *, debounce: RunInfo) -> None:
    _body("testapp.record_other", tag, 0, debounce)


@debounced_receiver(post_save, sender=Item, wait=0.3, name="testapp.item_saved")
def item_saved(sender, instance, pk, debounce, **kwargs):
    log = _log(
        "testapp.item_saved",
        instance.name if instance else "",
        debounce,
        value_seen=instance.value if instance else None,
        payload={"pk": pk, "created": kwargs.get("created")},
    )
    if instance is not None and instance.name.startswith("sleep:"):
        time.sleep(float(instance.name.split(":")[1]))
    log.finished = time.time()
    log.save(update_fields=["finished"])


@debounced_receiver(post_save, sender=Item, wait=0.3, name="testapp.item_audit")
def item_audit(sender, instance, pk, debounce, **kwargs):
    _body("testapp.item_audit", instance.name if instance else "", 0, debounce, payload={"pk": pk})


@debounced_receiver(post_save, sender=OtherItem, wait=0.3, name="testapp.other_saved")
def other_saved(sender, instance, pk, debounce, **kwargs):
    _body("testapp.other_saved", "", 0, debounce, payload={"pk": pk})


@debounced_receiver(
    post_save,
    sender=Item,
    wait=5,
    name="testapp.item_slow",
    key=lambda model, pk, **kw: f"slow:{model}:{pk}",
)
def item_slow(sender, instance, pk, debounce, **kwargs):
    if instance is not None and instance.name.startswith("slow"):
        _log("testapp.item_slow", instance.name, debounce, value_seen=instance.value)


@debounced_task(wait=0, name="testapp.coalesce")
def coalesce(tag: str, sleep: float = 0.0, *, debounce: RunInfo) -> None:
    _body("testapp.coalesce", tag, sleep, debounce)


@debounced_task(wait=0.2, max_wait=1.0, name="testapp.bounded")
def bounded(tag: str, *, debounce: RunInfo) -> None:
    _body("testapp.bounded", tag, 0.05, debounce)


@debounced_receiver(post_save, sender=Doc, wait=0, name="testapp.doc_saved")
def doc_saved(sender, instance, pk, debounce, **kwargs):
    _log(
        "testapp.doc_saved",
        "",
        debounce,
        value_seen=instance.value if instance else None,
        payload={"pk": pk, "created": kwargs.get("created")},
    )


@debounced_task(wait=0.2, name="testapp.failover", lease=5)
def failover(tag: str, *, debounce: RunInfo) -> None:
    _body("testapp.failover", tag, 0, debounce)


@debounced_task(
    wait=0.2, name="testapp.crashy", lease=3, key=lambda tag, sleep=0.0: f"crashy:{tag}"
)
def crashy(tag: str, sleep: float = 0.0, *, debounce: RunInfo) -> None:
    _body("testapp.crashy", tag, sleep, debounce)
