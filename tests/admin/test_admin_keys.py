"""The keys list and key page in detail: live values from Redis, projected fire time, last
run and outcome, filters, search, recent runs, and refused actions."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

from django_debounce import display
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.testing import run_due
from tests.testapp.tasks import record, record_slow

pytestmark = pytest.mark.django_db(transaction=True)
CHANGELIST = "admin:django_debounce_debouncekey_changelist"


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


def shown(page, key: str):
    """The changelist row object of ``key`` (with the live values the page used)."""
    for row in page.context["cl"].result_list:
        if row.key == key:
            return row
    raise AssertionError(f"{key!r} not on the page")


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0.35, "0.35 s"),
        (3, "3 s"),
        (4.87, "4.9 s"),
        (12.4, "12 s"),
        (125, "2 min 5 s"),
        (3600, "1 h"),
        (3 * 86400 + 7200, "3 d 2 h"),
    ],
)
def test_durations_for_operators(seconds, text):
    assert display.duration(seconds) == text


def test_fire_time_texts():
    now = timezone.now()
    key = DebounceKey(pending=2, due_at=now + timedelta(seconds=12.2))
    assert display.fire_time(key, now) == "in 12 s"
    key.due_at = now - timedelta(seconds=0.5)
    assert display.fire_time(key, now) == "now"
    key.due_at = now - timedelta(seconds=90)
    assert display.fire_time(key, now) == "overdue 1 min 30 s"
    key.not_before = now + timedelta(seconds=30)
    assert display.fire_time(key, now) == "retry in 30 s"
    key.due_at = key.not_before  # as the stores record a retry's backoff
    assert display.fire_time(key, now) == "retry in 30 s"
    key.due_at = now + timedelta(seconds=45)  # a trigger during the backoff moved it later
    assert display.fire_time(key, now) == "in 45 s"
    key.due_at, key.not_before = now - timedelta(seconds=90), None
    key.running_until = now + timedelta(seconds=60)
    assert display.fire_time(key, now) == "after the live run"
    assert display.fire_time(DebounceKey(pending=0), now) == ""


def test_changelist_shows_live_counts_fire_time_and_last_run(operator, eager, store):
    for _ in range(5):
        record_slow.trigger("live")  # a long wait: still pending when the page is read
    key = record_slow.resolve(("live",), {})[0]
    row = DebounceKey.objects.get(key=key)
    if store == "redis":
        # The Redis store writes the row when the flight opens and at its second trigger
        # (which makes the counter), not per merged trigger.
        assert (row.pending, row.triggers) == (2, 2)
    page = operator.get(reverse(CHANGELIST))
    html = page.content.decode()
    live = shown(page, key)
    # the pending count is live (the row's, plus what the key's counter absorbed); the totals
    # are the row's until a step folds the counter into it
    totals = 2 if store == "redis" else 5
    assert (live.live_pending, live.triggers, live.state) == (5, totals, "pending")
    assert live.first_trigger_at <= live.last_trigger_at
    fires = display.fire_time(live, timezone.now())
    assert fires.startswith("in "), fires  # "in 59 s", "in 1 min"
    assert re.search(r'class="field-fires">in (\d+(\.\d)? s|1 min)<', html), "no fire time"
    for column in ("first trigger", "last trigger", "fires", "last run", "pending (live)"):
        assert column in html.lower()

    record.trigger("done")
    assert run_due(now=timezone.now() + timedelta(seconds=1)) == 1
    page = operator.get(reverse(CHANGELIST))
    done = shown(page, record.resolve(("done",), {})[0])
    assert (done.runs, done.merged, done.last_outcome, done.state) == (1, 0, "success", "idle")
    # run_due(now=...) claimed it a second ahead of the clock: "just now", else "3 s ago".
    assert re.search(
        r'class="field-last_run">(just now|[^<]+ ago): success<', page.content.decode()
    )


def test_filters_by_state_and_task_and_search_by_key(operator, eager, store):
    record_slow.trigger("alpha")
    record_slow.trigger("beta")
    record.trigger("gamma")
    assert run_due(now=timezone.now() + timedelta(seconds=1)) == 1  # gamma only

    def keys(**params):
        page = operator.get(reverse(CHANGELIST), params)
        assert page.status_code == 200
        rows = page.context["cl"].result_list
        return sorted(json.loads(r.key.split(":", 1)[1])["args"][0] for r in rows)

    assert keys(state="pending") == ["alpha", "beta"]
    assert keys(state="idle") == ["gamma"]
    assert keys(task="testapp.record") == ["gamma"]
    assert keys(q="beta") == ["beta"]
    assert keys(state="pending", task="testapp.record") == []
    page = operator.get(reverse(CHANGELIST))
    assert "?task=testapp.record_slow" in page.content.decode()  # the task filter's choices


def test_key_page_lists_recent_runs_with_a_link_to_all(operator, eager, store):
    for i in range(25):
        record.trigger("many")
        record.trigger("many")
        assert run_due(now=timezone.now() + timedelta(seconds=1 + i)) == 1
    row = DebounceKey.objects.get()
    page = operator.get(reverse("admin:django_debounce_debouncekey_change", args=[row.pk]))
    html = page.content.decode()
    assert html.count('<tr class="debounce-run">') == 20  # the most recent 20 of 25
    assert "<td>25</td>" in html  # the latest run first
    link = reverse("admin:django_debounce_debouncerun_changelist") + (
        f"?debounce_key__id__exact={row.pk}"
    )
    assert link in html
    runs = operator.get(link)
    assert runs.status_code == 200
    assert runs.context["cl"].result_count == 25
    assert DebounceRun.objects.filter(debounce_key=row, triggers=2).count() == 25


def test_key_page_shows_live_values_of_a_redis_key(operator, eager):
    from django.test import override_settings

    with override_settings(DEBOUNCE_BACKEND="redis"):
        for _ in range(7):
            record_slow.trigger("detail")
        row = DebounceKey.objects.get()
        assert row.pending == 2
        page = operator.get(reverse("admin:django_debounce_debouncekey_change", args=[row.pk]))
    obj = page.context["original"]
    # live: the row's two pending triggers and the five the counter absorbed (the row's
    # total counts them once a step folds the counter)
    assert (obj.live_pending, obj.triggers, obj.live) == (7, 2, True)
    assert page.context["has_change_permission"] is False


def test_redis_down_falls_back_to_the_record(operator, eager, settings):
    import copy

    settings.DEBOUNCE_BACKEND = "redis"
    for _ in range(3):  # two in the row, one in the counter
        record_slow.trigger("down")
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["LOCATION"] = "redis://127.0.0.1:1/0"  # nothing listens there
    settings.CACHES = caches
    page = operator.get(reverse(CHANGELIST))
    assert page.status_code == 200
    assert shown(page, record_slow.resolve(("down",), {})[0]).live_pending == 2  # the record


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_debouncekey"))
    client.force_login(user)
    return client


@pytest.mark.parametrize("action", ["run_now", "cancel_pending", "purge_idle"])
def test_every_action_posted_without_change_permission_is_refused(viewer, eager, store, action):
    for _ in range(3):
        record_slow.trigger("refused")
    row = DebounceKey.objects.get()
    response = viewer.post(
        reverse(CHANGELIST), {"action": action, "_selected_action": [row.pk], "index": 0}
    )
    assert response.status_code == 403
    live = record_slow.get_backend().live_state(row.key_hash)
    assert (live["pending"], live["runs"], live["cancelled"]) == (3, 0, 0)
    assert DebounceKey.objects.filter(pk=row.pk).exists()


def test_change_permission_alone_gives_the_actions(client, eager, store):
    user = User.objects.create_user("ops", "o@example.com", "pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_debouncekey", "change_debouncekey"])
    )
    client.force_login(user)
    record_slow.trigger("ops")
    row = DebounceKey.objects.get()
    page = client.get(reverse(CHANGELIST))
    choices = [name for name, _label in page.context["action_form"].fields["action"].choices]
    assert {"run_now", "cancel_pending", "purge_idle"} <= set(choices)
    response = client.post(
        reverse(CHANGELIST),
        {"action": "cancel_pending", "_selected_action": [row.pk], "index": 0},
        follow=True,
    )
    assert "Cancelled 1 pending trigger(s) on 1 key(s)." in response.content.decode()
    # Still no add, edit or delete by hand.
    assert client.get(reverse("admin:django_debounce_debouncekey_add")).status_code == 403
    change = client.get(reverse("admin:django_debounce_debouncekey_change", args=[row.pk]))
    assert change.context["has_change_permission"] is False
