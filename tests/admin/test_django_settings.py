"""Django settings projects really have (issue 13.6): ``USE_TZ = False``, a ``TIME_ZONE``
other than UTC, a second ``AdminSite`` beside the default one, and a UUID primary key."""

from __future__ import annotations

import io
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse

from django_debounce import dbtime
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.testing import run_due
from tests.testapp import tasks
from tests.testapp.models import Ticket
from tests.testapp.tasks import record, record_slow

pytestmark = pytest.mark.django_db(transaction=True)
KEYS = "admin:django_debounce_debouncekey_changelist"
SUMMARY = "admin:django_debounce_debouncekey_summary"


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


def test_naive_datetimes_use_tz_false(operator, eager, store):
    """With ``USE_TZ = False`` (naive local times in the database) triggers, runs, the admin
    pages and the commands work, and the times they store are the right instants."""
    with override_settings(USE_TZ=False, TIME_ZONE="America/New_York"):
        before = datetime.now(UTC)
        result = record_slow.trigger("naive")
        assert result.due_at is not None and result.due_at.tzinfo is not None
        assert before + timedelta(seconds=50) < result.due_at < before + timedelta(seconds=70)
        record.trigger("done")
        assert run_due(now=dbtime.now() + timedelta(seconds=1)) == 1

        status = record_slow.status("naive")
        assert status is not None and status.pending == 1
        assert abs((status.due_at - result.due_at).total_seconds()) < 1  # the same instant
        row = DebounceKey.objects.get(key=status.key)
        assert abs((row.due_at - result.due_at).total_seconds()) < 1
        done = DebounceRun.objects.get(task_name="testapp.record")
        assert abs((done.started_at - datetime.now(UTC)).total_seconds()) < 30

        for name in (KEYS, SUMMARY):
            assert operator.get(reverse(name)).status_code == 200, name
        page = operator.get(reverse("admin:django_debounce_debouncekey_change", args=[row.pk]))
        assert page.status_code == 200
        out = io.StringIO()
        call_command("debounce_status", stdout=out)
        assert "in 1 min" in out.getvalue() or "in 59 s" in out.getvalue(), out.getvalue()
        call_command("debounce_status", "--index", stdout=out)
        call_command("debounce_purge", "--older-than", "1d", "--dry-run", stdout=out)


def test_a_second_admin_site_links_within_itself(operator, eager, store):
    """Pages served by another ``AdminSite`` (tests/urls.py mounts ``ops`` at /ops/) link
    into that site, not into /admin/."""
    record.trigger("ops", debounce_wait=0)
    assert run_due() == 1  # at the real clock: the summary counts runs started until now
    key = DebounceKey.objects.get(task_name="testapp.record")

    keys = operator.get("/ops/django_debounce/debouncekey/").content.decode()
    assert 'href="/ops/django_debounce/debouncekey/summary/"' in keys
    summary = operator.get("/ops/django_debounce/debouncekey/summary/").content.decode()
    links = re.findall(r'href="(/[^"]*)"', summary)
    assert links and all(not link.startswith("/admin/") for link in links), links
    assert "/ops/django_debounce/debouncekey/?task=testapp.record" in summary
    page = operator.get(f"/ops/django_debounce/debouncekey/{key.pk}/change/").content.decode()
    assert f'href="/ops/django_debounce/debouncerun/?debounce_key__id__exact={key.pk}"' in page


def test_a_uuid_primary_key_reaches_the_handler_as_a_uuid(eager):
    """The handler gets the model's own pk type, so ``pk == instance.pk`` holds."""
    tasks.TICKETS_SEEN.clear()
    tickets = [Ticket.objects.create(title=str(n)) for n in range(2)]
    assert run_due(now=dbtime.now() + timedelta(seconds=1)) == 3  # one key each, one batch
    single = sorted(
        (seen for seen in tasks.TICKETS_SEEN if "pk" in seen), key=lambda seen: str(seen["pk"])
    )
    assert [seen["pk"] for seen in single] == sorted((t.pk for t in tickets), key=str)
    for seen in single:
        assert isinstance(seen["pk"], uuid.UUID) and seen["pk"] == seen["instance_pk"]
    (collected,) = (seen for seen in tasks.TICKETS_SEEN if "pks" in seen)
    assert collected["pks"] == [t.pk for t in tickets]
    assert all(isinstance(pk, uuid.UUID) for pk in collected["pks"])
    assert collected["pks"] == collected["instance_pks"]
