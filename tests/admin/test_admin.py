"""The admin pages and their actions, through Django's test client on the real database."""

from __future__ import annotations

import html
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_debounce.models import DebounceKey
from tests.celery_app import app
from tests.testapp.models import RunLog
from tests.testapp.tasks import record_slow

pytestmark = pytest.mark.django_db(transaction=True)
CHANGELIST = "admin:django_debounce_debouncekey_changelist"


@pytest.fixture
def operator(client):
    user = User.objects.create_superuser("op", "op@example.com", "pw")
    client.force_login(user)
    return client


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_debouncekey"))
    client.force_login(user)
    return client


def post_action(client, action, rows):
    return client.post(
        reverse(CHANGELIST),
        {
            "action": action,
            "_selected_action": [r.pk for r in rows],
            "index": 0,
        },
        follow=True,
    )


def test_changelist_shows_live_pending_and_run_now_runs_once(operator, eager, store):
    for _ in range(20):
        record_slow.trigger("admin")
    page = operator.get(reverse(CHANGELIST))
    assert page.status_code == 200
    row = DebounceKey.objects.get()
    assert page.context["cl"].result_list[0].live_pending == 20
    response = post_action(operator, "run_now", [row])
    assert "1 key(s) with pending triggers will run now." in response.content.decode()
    log = RunLog.objects.get(tag="admin")
    assert log.triggers == 20
    live = record_slow.get_backend().live_state(row.key_hash)
    assert (live["runs"], live["merged"], live["pending"]) == (1, 19, 0)


def test_cancel_and_purge_actions_report_counts(operator, eager, store):
    record_slow.trigger("a")
    record_slow.trigger("a")
    row = DebounceKey.objects.get()
    response = post_action(operator, "cancel_pending", [row])
    assert "Cancelled 2 pending trigger(s) on 1 key(s)." in response.content.decode()
    response = post_action(operator, "purge_idle", [DebounceKey.objects.get()])
    assert "Purged 1 idle key(s)" in response.content.decode()
    assert not DebounceKey.objects.exists()


def test_view_permission_shows_the_page_without_actions_and_refuses_a_posted_action(viewer, store):
    for _ in range(3):
        record_slow.trigger("v")
    page = viewer.get(reverse(CHANGELIST))
    assert page.status_code == 200
    assert page.context["action_form"] is None
    row = DebounceKey.objects.get()
    assert post_action(viewer, "cancel_pending", [row]).status_code == 403
    assert record_slow.get_backend().live_state(row.key_hash)["pending"] == 3
    assert (
        viewer.get(reverse("admin:django_debounce_debouncekey_change", args=[row.pk])).status_code
        == 200
    )
    add = viewer.get(reverse("admin:django_debounce_debouncekey_add"))
    assert add.status_code == 403


def test_keys_of_a_removed_task_are_skipped_by_run_now_and_cancelled(operator, eager, store):
    for tag in ("x", "y"):
        record_slow.trigger(tag)
    rows = list(DebounceKey.objects.all())
    name = record_slow.name
    task = app.tasks.pop(name)  # as if the task was removed or renamed
    try:
        response = post_action(operator, "run_now", rows).content.decode()
        assert "Skipped 2 key(s) of tasks that are not registered" in response
        assert response.count("Skipped") == 1  # one message, not one per key
        assert "0 key(s) with pending triggers will run now." in response
        response = post_action(operator, "cancel_pending", rows).content.decode()
        assert "Cancelled 2 pending trigger(s) on 2 key(s)." in response
    finally:
        app.tasks[name] = task
    assert [task.get_backend().live_state(r.key_hash)["pending"] for r in rows] == [0, 0]
    assert not RunLog.objects.exists()


def test_runs_and_keys_lists_show_the_key_without_its_task_name(operator, eager, store):
    """The task has a column of its own: the key column of the runs and of the keys shows
    the key alone (the default key starts with the task's name), a long one cut, whole in
    its tooltip."""
    from datetime import timedelta

    from django_debounce import dbtime
    from django_debounce.admin import KEY_CHARS
    from django_debounce.testing import run_due
    from tests.testapp.tasks import record

    record.trigger("short")
    record.trigger("long" * 20)
    assert run_due(now=dbtime.now() + timedelta(seconds=1)) == 2
    page = operator.get(reverse("admin:django_debounce_debouncerun_changelist"))
    cells = {
        html.unescape(re.sub(r"<[^>]+>", "", text)): html.unescape(title or "")
        for title, text in re.findall(
            r'<td class="field-key">(?:<span title="([^"]*)">)?(.*?)</td>', page.content.decode()
        )
    }
    short, long = (record.resolve((tag,), {})[0] for tag in ("short", "long" * 20))
    prefix = f"{record.name}:"
    assert short.startswith(prefix) and long.startswith(prefix)
    shown_long = long.removeprefix(prefix)[: KEY_CHARS - 1] + "…"
    assert cells == {short.removeprefix(prefix): "", shown_long: long}
    page = operator.get(reverse("admin:django_debounce_debouncekey_changelist"))
    cells = {
        html.unescape(re.sub(r"<[^>]+>", "", text)): html.unescape(title or "")
        for title, text in re.findall(
            r'<th class="field-key_text"><a [^>]*>(?:<span title="([^"]*)">)?(.*?)</a></th>',
            page.content.decode(),
        )
    }
    assert cells == {short.removeprefix(prefix): "", shown_long: long}
