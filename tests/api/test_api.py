"""The public API's contract without a worker: keys, validation, errors, eager mode, checks."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import timedelta

import pytest
from celery import Task
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db.models.signals import post_save
from django.test import override_settings
from django.utils import timezone

from django_debounce import debounced_receiver, debounced_task
from django_debounce.checks import check_backend, sqlite_warnings
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.state import Finish, FlightOptions
from django_debounce.testing import run_due
from tests.celery_app import app
from tests.testapp.models import RunLog
from tests.testapp.tasks import record, record_slow


def test_debounced_task_is_a_real_celery_task():
    assert isinstance(record, Task)
    assert record.name == "testapp.record"
    assert "testapp.record" in app.tasks


def test_positional_and_keyword_arguments_share_a_key():
    assert record.resolve(("a",), {})[0] == record.resolve((), {"tag": "a"})[0]
    assert record.resolve(("a",), {})[0] == record.resolve(("a", 0.0), {})[0]
    assert record.resolve(("a",), {})[0] != record.resolve(("b",), {})[0]


@pytest.mark.django_db
def test_non_json_payload_is_refused_and_nothing_stored(store):
    with pytest.raises(TypeError, match="JSON"):
        record.trigger(object())
    with pytest.raises(TypeError, match="type set"):
        record.trigger({"when": {timezone.now()}})
    assert not DebounceKey.objects.exists()


def test_wrong_arguments_raise_type_error():
    with pytest.raises(TypeError):
        record.trigger()
    with pytest.raises(TypeError):
        record.trigger("a", nope=1)


@pytest.mark.parametrize(
    "options, error",
    [
        ({"wait": -1}, ImproperlyConfigured),
        ({"wait": "5"}, ImproperlyConfigured),
        ({"max_wait": -0.5}, ImproperlyConfigured),
        ({"key": "not callable"}, ImproperlyConfigured),
        ({"leading": False, "trailing": False}, ImproperlyConfigured),
        ({"collect": True, "collect_limit": 0}, ImproperlyConfigured),
        ({"collect": True, "collect_limit": "10"}, ImproperlyConfigured),
        ({"lease": 0}, ImproperlyConfigured),
    ],
)
def test_bad_decorator_options_name_the_fix(options, error):
    with pytest.raises(error):
        debounced_task(**options)(lambda x: None)


def test_timedelta_durations():
    def td(x):
        return x

    task = debounced_task(wait=timedelta(seconds=2), name="testapp.td")(td)
    assert task.wait == 2.0


@pytest.mark.django_db(transaction=True)
def test_eager_trigger_stays_pending_until_run_due(eager, store):
    for _ in range(3):
        record.trigger("eager")
    assert not RunLog.objects.exists()
    assert run_due() == 0  # not due yet: wait is 0.3 s
    assert run_due(now=timezone.now() + timedelta(seconds=1)) == 1
    log = RunLog.objects.get()
    assert log.triggers == 3
    live = record.get_backend().live_state(DebounceKey.objects.get().key_hash)
    assert (live["pending"], live["runs"], live["merged"]) == (0, 1, 2)


@pytest.mark.django_db(transaction=True)
def test_eager_flush_runs_now_and_cancel_drops(eager, store):
    record_slow.trigger("f")
    assert record_slow.flush("f") is True
    assert RunLog.objects.filter(task="testapp.record_slow").count() == 1
    assert record_slow.flush("f") is False
    record_slow.trigger("c")
    record_slow.trigger("c")
    assert record_slow.cancel("c") == 2
    assert run_due(now=timezone.now() + timedelta(seconds=10)) == 0
    live = record.get_backend().live_state(DebounceKey.objects.get(key__contains='"c"').key_hash)
    assert (live["pending"], live["cancelled"], live["state"]) == (0, 2, "idle")


@pytest.mark.django_db(transaction=True)
def test_disabled_records_nothing(eager, store):
    with override_settings(DEBOUNCE_ENABLED=False):
        result = record.trigger("off")
    assert result.scheduled is False and result.pending is None
    assert not DebounceKey.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_lost_lease_is_redone_and_late_finish_changes_nothing(store):
    from django_debounce.backends import get_backend
    from django_debounce.keys import key_hash

    backend = get_backend()
    name = "tests.unpumped"  # a task no worker's pump knows: only this test moves its key
    hashed = key_hash(name, "k")
    options = FlightOptions(wait=0, lease=0.1)
    _result, dispatch = backend.trigger(
        task_name=name,
        key="k",
        key_hash=hashed,
        payload_json='["x"]',  # stored compact: the task's arguments alone
        options=options,
    )
    assert dispatch is not None  # due at once (not published: no worker in this test)
    first = backend.fire(hashed, None, task_name=name, options=options)
    assert first.claim is not None and first.claim.triggers == 1
    later = timezone.now() + timedelta(seconds=5)  # the 0.1 s lease ran out
    second = backend.fire(
        hashed, None, task_name=name, options=replace(options, lease=60), now=later
    )
    assert second.claim is not None
    assert second.claim.triggers == 1  # the lost run's trigger went back to pending
    assert second.claim.run_id == first.claim.run_id + 1
    late = backend.finish(
        hashed,
        first.claim.run_id,
        Finish(ok=True),
        task_name=name,
        options=options,
        now=later,
    )
    assert late is None
    assert backend.live_state(hashed)["state"] == "running"
    assert DebounceRun.objects.get(run_id=first.claim.run_id).outcome == "lost"
    assert DebounceRun.objects.get(run_id=second.claim.run_id).outcome == "running"
    backend.finish(
        hashed,
        second.claim.run_id,
        Finish(ok=True),
        task_name=name,
        options=options,
        now=later + timedelta(seconds=1),
    )
    live = backend.live_state(hashed)
    assert (live["state"], live["triggers"], live["runs"], live["pending"]) == ("idle", 1, 1, 0)
    assert DebounceKey.objects.get().state == "idle"
    assert DebounceRun.objects.get(run_id=second.claim.run_id).outcome == "success"


def test_check_e001_for_unimportable_backend():
    with override_settings(DEBOUNCE_BACKEND="nope.Missing"):
        ids = [m.id for m in check_backend()]
    assert ids == ["django_debounce.E001"]


def test_check_w002_for_deferred_sqlite():
    dbs = {"x": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    assert [m.id for m in sqlite_warnings(dbs)] == ["django_debounce.W002"]
    dbs["x"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE"}
    assert sqlite_warnings(dbs) == []


@pytest.mark.django_db
def test_no_missing_migrations():
    out = io.StringIO()
    call_command("makemigrations", "django_debounce", "--check", "--dry-run", stdout=out)


@pytest.mark.django_db
def test_plain_call_of_a_body_declaring_debounce_gets_none():
    # record(tag, sleep=0, note="", *, debounce) called as the worker runs a .delay() message
    record("plain")
    log = RunLog.objects.get(tag="plain")
    assert log.triggers is None and log.key == ""


def test_receiver_refuses_rows_of_another_model():
    from tests.testapp.models import Item, OtherItem
    from tests.testapp.tasks import item_saved

    with pytest.raises(TypeError, match="testapp.Item"):
        item_saved.trigger(OtherItem(pk=1))
    with pytest.raises(TypeError, match="testapp.Item"):
        item_saved.trigger(OtherItem, 1)
    assert item_saved.resolve((Item(pk=3),), {})[0] == "testapp.item:3"


def test_misspelt_option_is_a_type_error_with_a_suggestion():
    with pytest.raises(TypeError, match="'wait'"):
        debounced_task(wiat=1)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_durations_are_refused(value):
    with pytest.raises(ImproperlyConfigured, match="finite"):
        debounced_task(wait=value)


def test_wrong_trigger_arguments_name_the_task():
    for call in (record.trigger, record.status, record.flush, record.cancel):
        with pytest.raises(TypeError, match=r"testapp\.record \(trigger, status, flush, cancel\)"):
            call(1, 2, 3, 4)


def test_check_e001_for_a_class_that_is_not_a_backend():
    with override_settings(DEBOUNCE_BACKEND="django_debounce.models.DebounceKey"):
        assert [m.id for m in check_backend()] == ["django_debounce.E001"]


def test_plain_delay_checks_arguments_at_call_time():
    with pytest.raises(TypeError):
        record.delay("tag", 1, "note", "one too many")
    with pytest.raises(TypeError):
        record.delay(nope=1)


def test_receiver_trigger_refuses_rows_that_cannot_exist():
    from tests.testapp.models import Item
    from tests.testapp.tasks import item_saved

    with pytest.raises(TypeError, match="save it first"):
        item_saved.trigger(Item())
    with pytest.raises(TypeError, match="save it first"):
        item_saved.trigger(Item, None)
    with pytest.raises(TypeError, match="not a primary key"):
        item_saved.trigger(Item, "abc")


def test_receiver_key_with_the_wrong_signature_fails_at_decoration():
    from django.db.models.signals import post_save

    from django_debounce import debounced_receiver
    from tests.testapp.models import OtherItem

    with pytest.raises(ImproperlyConfigured, match="model, pk, sender, signal, kwargs"):
        debounced_receiver(
            post_save, sender=OtherItem, name="testapp.bad_key", key=lambda instance: "x"
        )(lambda sender, **kw: None)


def test_receiver_refuses_bind_true_and_takes_bind_false():
    from django.db.models.signals import post_save

    from django_debounce import debounced_receiver
    from tests.testapp.models import OtherItem

    def handler(sender, **kwargs):
        return None

    with pytest.raises(ImproperlyConfigured, match="does not take bind=True"):
        debounced_receiver(post_save, sender=OtherItem, name="testapp.bound", bind=True)
    task = debounced_receiver(post_save, sender=OtherItem, name="testapp.unbound", bind=False)(
        handler
    )
    assert task.name == "testapp.unbound"
    post_save.disconnect(dispatch_uid="django_debounce:testapp.unbound", sender=OtherItem)


@debounced_task(wait=60, collect=True, name="testapp.plain_batch")
def plain_batch(items):
    return items


@pytest.mark.django_db(transaction=True)
def test_collect_flush_and_cancel_need_no_item_with_the_default_key(store):
    plain_batch.trigger(1)
    plain_batch.trigger(2)
    assert plain_batch.cancel() == 2
    plain_batch.trigger(3)
    assert plain_batch.flush() is True


def test_collecting_receiver_with_key_is_triggered_by_hand_with_its_own_signature():
    from django.db.models.signals import post_save

    from django_debounce import debounced_receiver
    from tests.testapp.models import OtherItem

    def other_batch(sender, pks, instances, **kw):
        return pks

    task = debounced_receiver(
        post_save,
        sender=OtherItem,
        collect=True,
        name="testapp.other_batch_by_parity",
        key=lambda model, pk: f"{model}:{int(pk) % 2}",
    )(other_batch)
    key, item, _encoded = task._resolve((OtherItem, 3), {})
    assert (key, item) == ("testapp.otheritem:1", {"model": "testapp.otheritem", "pk": 3})


def test_backend_read_before_a_setting_change_is_not_cached_over_it(monkeypatch):
    """A thread that read DEBOUNCE_BACKEND just before another changed it must not leave the
    old store cached for the new setting."""
    import functools
    import threading

    from django_debounce import backends

    started, release = threading.Event(), threading.Event()
    load = backends._load

    def slow_load(path):
        started.set()
        assert release.wait(10)
        return load(path)

    with override_settings(DEBOUNCE_BACKEND="redis"):
        monkeypatch.setattr(backends, "_load", functools.cache(slow_load))
        reader = threading.Thread(target=backends.get_backend)
        reader.start()
        assert started.wait(10)
        with override_settings(DEBOUNCE_BACKEND="database"):
            release.set()
            reader.join(10)
            monkeypatch.setattr(backends, "_load", load)
            assert type(backends.get_backend()).__name__ == "DatabaseBackend"


@pytest.mark.django_db(transaction=True)
def test_receiver_without_sender_is_not_triggered_by_the_apps_own_rows(store):
    from django.db.models.signals import post_save

    from django_debounce import debounced_receiver
    from tests.testapp.models import OtherItem

    name = f"tests.any_model_saved_{store}"

    @debounced_receiver(post_save, wait=60, name=name)
    def any_model_saved(sender, **kwargs):
        """Reacts to the saves of every model."""

    try:
        row = OtherItem.objects.create(value=1)
        OtherItem.objects.filter(pk=row.pk).get().save()
        mine = list(DebounceKey.objects.filter(task_name=name))
        assert [k.key for k in mine] == [f"testapp.otheritem:{row.pk}"]
        assert any_model_saved.get_backend().live_state(mine[0].key_hash)["pending"] == 2
    finally:
        post_save.disconnect(dispatch_uid=f"django_debounce:{name}")


def test_receiver_handler_without_kwargs_is_refused_at_decoration():
    from django.db.models.signals import post_save

    from django_debounce import debounced_receiver

    with pytest.raises(TypeError, match=r"must accept \*\*kwargs.*def no_kwargs\(sender, \*\*kw"):

        @debounced_receiver(post_save, sender=RunLog, name="tests.no_kwargs")
        def no_kwargs(sender, instance):
            pass

    @debounced_receiver(post_save, sender=RunLog, collect=True, name="tests.collect_named")
    def collect_named(sender, pks, instances, signal, debounce):
        """A collecting handler may name exactly its keywords."""

    post_save.disconnect(dispatch_uid="django_debounce:tests.collect_named")


@pytest.mark.parametrize(
    "setting, value, text",
    [
        ("DEBOUNCE_DISPATCH_GRACE", "1m", "DEBOUNCE_DISPATCH_GRACE must be a number of seconds"),
        ("DEBOUNCE_LEASE", "5m", "DEBOUNCE_LEASE must be a number of seconds"),
        ("DEBOUNCE_LEASE", 0, "DEBOUNCE_LEASE must be a finite number > 0 seconds, got 0"),
        ("DEBOUNCE_LEASE", -5, "DEBOUNCE_LEASE must be a finite number > 0 seconds, got -5"),
        ("DEBOUNCE_PUMP_INTERVAL", "x", "DEBOUNCE_PUMP_INTERVAL must be a number of seconds"),
        ("DEBOUNCE_ENABLED", "false", "DEBOUNCE_ENABLED must be True or False"),
        ("DEBOUNCE_ON_COMMIT", 1, "DEBOUNCE_ON_COMMIT must be True or False"),
        ("DEBOUNCE_REDIS_URL", "http://x", "DEBOUNCE_REDIS_URL must be a redis://, rediss://"),
        ("DEBOUNCE_REDIS_CLUSTER", "nonsense", "DEBOUNCE_REDIS_CLUSTER must be a list of"),
    ],
)
def test_check_e002_names_a_setting_of_the_wrong_kind(setting, value, text):
    from django_debounce.checks import check_settings

    with override_settings(**{setting: value}):
        found = [m for m in check_settings() if m.id == "django_debounce.E002"]
    assert [m.obj for m in found] == [setting]
    assert text in found[0].msg


def test_check_w003_suggests_the_setting_a_misspelt_one_meant():
    from django_debounce.checks import check_settings

    assert check_settings() == []
    with override_settings(DEBOUNCE_LEASES=60):
        found = check_settings()
    assert [(m.id, m.obj, m.hint) for m in found] == [
        ("django_debounce.W003", "DEBOUNCE_LEASES", "Did you mean DEBOUNCE_LEASE?")
    ]


@pytest.mark.django_db(transaction=True)
def test_a_bad_duration_setting_is_an_error_naming_it_at_trigger_time_too(store):
    with override_settings(DEBOUNCE_DISPATCH_GRACE="1m"):
        with pytest.raises(ImproperlyConfigured, match="DEBOUNCE_DISPATCH_GRACE"):
            record.trigger("bad-grace")
    assert not DebounceKey.objects.filter(pending__gt=0).exists()  # not counted: refused


def test_collect_limit_without_collect_and_a_negative_lease_name_the_fix():
    with pytest.raises(ImproperlyConfigured, match="add collect=True"):
        debounced_task(collect_limit=10, name="tests.limit_only")(lambda x: None)
    with pytest.raises(ImproperlyConfigured, match="lease must be a finite number > 0 seconds"):
        debounced_task(lease=-3, name="tests.negative_lease")(lambda x: None)


def test_async_bodies_are_refused_at_decoration():
    from django.db.models.signals import post_save

    from django_debounce import debounced_receiver

    async def body(x):
        pass

    with pytest.raises(TypeError, match="never be awaited"):
        debounced_task(name="tests.async_body")(body)

    async def handler(sender, **kwargs):
        pass

    with pytest.raises(TypeError, match="never be awaited"):
        debounced_receiver(post_save, sender=RunLog, name="tests.async_handler")(handler)


def test_check_w004_for_an_auto_cache_alias_that_is_not_in_caches():
    with override_settings(DEBOUNCE_BACKEND="auto", DEBOUNCE_CACHE_ALIAS="nope"):
        found = [(m.id, "nope" in m.msg) for m in check_backend()]
    assert found == [("django_debounce.W004", True)]
    assert check_backend() == []


@debounced_task(wait=30, collect=True, name="tests.batch_default")
def batch_default(items: list) -> None:
    """Collects every item under its name (the default key); registered here only."""


def test_a_task_name_longer_than_the_stores_keep_is_refused_when_declared():
    with pytest.raises(ImproperlyConfigured, match="more than 255 characters"):

        @debounced_task(name="tests." + "z" * 250)
        def too_long() -> None:
            """Never registered."""

    with pytest.raises(ImproperlyConfigured, match="more than 255 characters"):

        @debounced_receiver(post_save, sender=RunLog, name="tests." + "x" * 250)
        def too_long_receiver(sender, **kwargs) -> None:
            """Never connected."""


@pytest.mark.django_db(transaction=True)
def test_an_item_names_no_key_of_a_collecting_task_with_the_default_key(eager, store):
    batch_default.trigger({"tag": "a"})
    batch_default.trigger({"tag": "b"})
    for call in (batch_default.flush, batch_default.cancel, batch_default.status):
        with pytest.raises(TypeError, match="act on the whole batch"):
            call({"tag": "a"})
    assert batch_default.status().pending == 2  # nothing was dropped
    assert batch_default.cancel() == 2


@pytest.mark.django_db(transaction=True)
def test_an_eager_trigger_due_at_once_is_not_scheduled(eager, store):
    """Under ``task_always_eager`` nothing is published: the flight waits for ``run_due``."""
    result = record.trigger("now", debounce_wait=0)
    assert (result.pending, result.scheduled, result.publish_failed) == (1, False, False)
    assert not RunLog.objects.exists()
    assert run_due() == 1
