"""Debounced tasks and receivers the tests drive through real worker processes."""

import os
import time

from django.db.models.signals import post_save

from django_debounce import RunInfo, debounced_receiver, debounced_task
from tests.testapp.models import Batchy, Doc, Item, OtherItem, RunLog, Ticket


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


@debounced_task(wait=0.3, name="testapp.record_args")
def record_args(tag: str, values: list, *, debounce: RunInfo | None = None) -> None:
    """Records the type and repr of each of ``values`` as the body received them (a typed
    argument's round trip through the store, or through Celery's JSON for ``.delay()``)."""
    seen = [[f"{type(v).__module__}.{type(v).__qualname__}", repr(v)] for v in values]
    _log("testapp.record_args", tag, debounce, payload=seen)


@debounced_task(wait=60, name="testapp.record_slow")
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


@debounced_task(
    wait=0.2,
    name="testapp.hard_limited",
    time_limit=2,
    max_retries=0,
    key=lambda tag, sleep=0.0: f"hard_limited:{tag}",
)
def hard_limited(tag: str, sleep: float = 0.0, *, debounce: RunInfo) -> None:
    """Killed by its hard time limit when it sleeps more than 2 s; never retried (its lease:
    2 + 5 s)."""
    _body("testapp.hard_limited", tag, sleep, debounce, payload={"sleep": sleep})


# -- edges (lodash): a run on the leading edge, then a trailing one only if more came -----


@debounced_task(wait=1.0, leading=True, name="testapp.lead")
def lead(tag: str, *, debounce: RunInfo) -> None:
    _body("testapp.lead", tag, 0, debounce)


@debounced_task(wait=1.0, leading=True, trailing=False, name="testapp.lead_only")
def lead_only(tag: str, *, debounce: RunInfo) -> None:
    _body("testapp.lead_only", tag, 0, debounce)


@debounced_task(wait=0.5, max_wait=0.5, leading=True, name="testapp.throttled")
def throttled(tag: str, *, debounce: RunInfo) -> None:
    _body("testapp.throttled", tag, 0, debounce)


# -- collect: one run per flight with the distinct items ---------------------------------


@debounced_task(
    wait=0.3, collect=True, collect_limit=5, name="testapp.batch", key=lambda item: item["tag"]
)
def batch(items: list, *, debounce: RunInfo) -> None:
    tag = items[0]["tag"] if items else ""
    _body("testapp.batch", tag, 0, debounce, payload=[i["n"] for i in items])


@debounced_receiver(post_save, sender=Batchy, wait=0.3, collect=True, name="testapp.batchy_saved")
def batchy_saved(sender, pks, instances, debounce, **kwargs):
    _log(
        "testapp.batchy_saved",
        sender._meta.label_lower,
        debounce,
        payload={"pks": pks, "seen": [[i.pk, i.value] for i in instances]},
    )


# -- failures and retries -----------------------------------------------------------------


@debounced_task(wait=0.2, name="testapp.flaky", default_retry_delay=1.0, max_retries=2, lease=20)
def flaky(tag: str, fail_times: int = 1, sleep: float = 0.0, *, debounce: RunInfo) -> None:
    log = _log("testapp.flaky", tag, debounce, payload={"attempt": debounce.attempt})
    if sleep:
        time.sleep(sleep)
    log.finished = time.time()
    log.save(update_fields=["finished"])
    if debounce.attempt < fail_times:
        raise RuntimeError(f"flaky failure {debounce.attempt}")


@debounced_task(wait=0.2, name="testapp.asks_retry", max_retries=3)
def asks_retry(tag: str, *, debounce: RunInfo) -> None:
    log = _log("testapp.asks_retry", tag, debounce, payload={"attempt": debounce.attempt})
    log.finished = time.time()
    log.save(update_fields=["finished"])
    if debounce.attempt == 0:
        asks_retry.retry(countdown=0.3, exc=ValueError("not yet"))


# -- broker and recovery ------------------------------------------------------------------


@debounced_task(wait=3.0, name="testapp.eta")
def eta(tag: str, *, debounce: RunInfo) -> None:
    _body("testapp.eta", tag, 0, debounce)


@debounced_task(wait=0.1, name="testapp.orphan")
def orphan(tag: str, *, debounce: RunInfo) -> None:
    _body("testapp.orphan", tag, 0, debounce)


@debounced_task(wait=1, name="testapp.limited", time_limit=7)
def limited(tag: str) -> None:
    pass


@debounced_task(
    wait=0.1,
    name="testapp.auto_retry",
    autoretry_for=(KeyError,),
    retry_backoff=2,
    retry_jitter=False,
    max_retries=1,
)
def auto_retry(tag: str, *, debounce: RunInfo) -> None:
    _log("testapp.auto_retry", tag, debounce, payload={"attempt": debounce.attempt})
    if tag.startswith("value"):
        raise ValueError(tag)  # not in autoretry_for: fails at once, as in Celery
    raise KeyError(tag)


@debounced_task(wait=0.1, name="testapp.long_runner", lease=1.5)
def long_runner(tag: str, *, debounce: RunInfo) -> None:
    _body("testapp.long_runner", tag, 4.0, debounce)


# -- lodash cases in real time (tests/stores/test_lodash.py): 1 lodash millisecond = 50 ms ---

LODASH_MS = 0.05


@debounced_task(wait=32 * LODASH_MS, name="testapp.lodash_debounce")
def lodash_debounce(tag: str, *, debounce: RunInfo) -> None:
    """``_.debounce(func, 32)``."""
    _body("testapp.lodash_debounce", tag, 0, debounce)


@debounced_task(wait=32 * LODASH_MS, leading=True, name="testapp.lodash_leading")
def lodash_leading(tag: str, *, debounce: RunInfo) -> None:
    """``_.debounce(func, 32, {leading: true})``."""
    _body("testapp.lodash_leading", tag, 0, debounce)


@debounced_task(wait=32 * LODASH_MS, max_wait=64 * LODASH_MS, name="testapp.lodash_bounded")
def lodash_bounded(tag: str, *, debounce: RunInfo) -> None:
    """``_.debounce(func, 32, {maxWait: 64})``."""
    _body("testapp.lodash_bounded", tag, 0, debounce)


@debounced_task(
    wait=32 * LODASH_MS,
    max_wait=32 * LODASH_MS,
    leading=True,
    name="testapp.lodash_throttle",
    key=lambda tag, arg="": tag,
)
def lodash_throttle(tag: str, arg: str = "", *, debounce: RunInfo) -> None:
    """``_.throttle(func, 32)``."""
    _body("testapp.lodash_throttle", tag, 0, debounce, payload={"arg": arg})


def _recursive(store: str):
    """``_.throttle(func, 32)`` whose run calls it again with the first of ``then`` (a recursive
    call, made while the run is live). The trigger made in the worker must reach the store of
    the case, so the task is pinned to it (one task per store)."""
    name = f"testapp.lodash_recursive_{store}"

    @debounced_task(
        wait=32 * LODASH_MS,
        max_wait=32 * LODASH_MS,
        leading=True,
        name=name,
        backend=store,
        key=lambda tag, arg="", then=None, pause=0.0: tag,
    )
    def recursive(
        tag: str, arg: str = "", then: list | None = None, pause: float = 0.0, *, debounce: RunInfo
    ) -> None:
        _body(name, tag, pause, debounce, payload={"arg": arg})
        if then:
            # the calls after the first come 2 lodash ms into their run: lodash makes them
            # exactly `wait` after the previous call (a leading edge by 0 ms); in real time a
            # run's own latencies would put them a few ms either side of that boundary
            recursive.trigger(tag, then[0], then[1:], 2 * LODASH_MS)

    return recursive


lodash_recursive = {store: _recursive(store) for store in ("redis", "database")}


# -- a UUID primary key: the handlers get the model's own type ----------------------------

# What the handlers below were called with, in this process (the tests run them eagerly).
TICKETS_SEEN: list[dict] = []


@debounced_receiver(post_save, sender=Ticket, wait=0.3, name="testapp.ticket_saved")
def ticket_saved(sender, pk, instance, **kwargs):
    TICKETS_SEEN.append({"pk": pk, "instance_pk": instance.pk if instance else None})


@debounced_receiver(
    post_save, sender=Ticket, wait=0.3, collect=True, name="testapp.tickets_collected"
)
def tickets_collected(sender, pks, instances, **kwargs):
    TICKETS_SEEN.append({"pks": pks, "instance_pks": [i.pk for i in instances]})


# -- the worker's main process (tests/worker/test_worker.py) -----------------------------


@debounced_task(wait=0.2, name="testapp.hosts", lease=10, key=lambda tag, sleep=0.0: tag)
def hosts(tag: str, sleep: float = 0.0, *, debounce: RunInfo) -> None:
    """Runs on several workers at once (``test_worker.py``): lease 10 s."""
    _body("testapp.hosts", tag, sleep, debounce)


@debounced_task(wait=0, name="testapp.gil_holder", lease=1.5, key=lambda tag, seconds: tag)
def gil_holder(tag: str, seconds: float, *, debounce: RunInfo) -> None:
    """Holds the GIL for ``seconds``, in C calls (``sum(range(n))`` never releases it) of
    about 1.6 s each, longer than its lease: the lease keeper in the main process must keep
    the lease alive."""
    log = _log("testapp.gil_holder", tag, debounce)
    started = time.perf_counter()
    sum(range(1_000_000))
    n = int(1_000_000 * 1.6 / max(time.perf_counter() - started, 1e-4))
    while time.perf_counter() - started < seconds:
        sum(range(n))
    log.finished = time.time()
    log.save(update_fields=["finished"])


@debounced_task(wait=0, name="testapp.threads")
def threads(tag: str, *, debounce: RunInfo) -> None:
    """Reports the threads of the pool process that runs it."""
    import threading

    _body(
        "testapp.threads",
        tag,
        0,
        debounce,
        payload={"threads": [t.name for t in threading.enumerate()], "ppid": os.getppid()},
    )


def _register_threads_command() -> None:
    """``test_threads``: a remote control command answered by a worker's main process, in
    the consumer's thread: its pid, that thread's name and every thread's name."""
    from celery.worker.control import inspect_command

    @inspect_command(name="test_threads")
    def test_threads(state, **kwargs):
        import threading

        return {
            "pid": os.getpid(),
            "current": threading.current_thread().name,
            "threads": [t.name for t in threading.enumerate()],
        }


_register_threads_command()


# -- the lease keeper after a stall of the worker's main process (test_keeper_stall.py) ---

from celery import shared_task  # noqa: E402
from celery.signals import task_failure, task_revoked  # noqa: E402

# Where the worker's main process records what Celery made of the tasks below (a Redis list
# of the cache's database: one JSON object per outcome).
OUTCOMES = "testapp:celery-outcomes"


@debounced_task(wait=0, name="testapp.stalled", lease=3, key=lambda tag, sleep=0.0: tag)
def stalled(tag: str, sleep: float = 0.0, *, debounce: RunInfo) -> None:
    """A run of ``sleep`` seconds with a 3 s lease; a redo (``attempt`` > 0: the first run
    was lost) returns at once."""
    _body("testapp.stalled", tag, sleep if not debounce.attempt else 0.0, debounce)


@shared_task(name="testapp.plain")
def plain(tag: str, sleep: float = 0.0) -> None:
    """A plain Celery task (not debounced): one RunLog row, ``finished`` set when it ends."""
    _body("testapp.plain", tag, sleep, None)


def _record_outcome(outcome: str, task_id: str, sender, exception=None) -> None:
    import json

    import redis
    from django.conf import settings

    if getattr(sender, "name", None) not in ("testapp.stalled", "testapp.plain"):
        return
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    try:
        client.rpush(
            OUTCOMES,
            json.dumps(
                {
                    "outcome": outcome,
                    "task": sender.name,
                    "id": task_id,
                    "exception": type(exception).__name__ if exception is not None else "",
                    "pid": os.getpid(),
                }
            ),
        )
    finally:
        client.close()


@task_failure.connect(weak=False, dispatch_uid="testapp.stalled.failure")
def _stalled_failed(sender=None, task_id=None, exception=None, **kwargs):
    _record_outcome("failure", task_id, sender, exception)


@task_revoked.connect(weak=False, dispatch_uid="testapp.stalled.revoked")
def _stalled_revoked(sender=None, request=None, **kwargs):
    _record_outcome("revoked", getattr(request, "id", None), sender)
