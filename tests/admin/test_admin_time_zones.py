"""Times on the debounce pages as Django's admin shows its own, with the zone named (issue
item 6): under ``USE_TZ = False`` the database holds naive times in ``TIME_ZONE`` and Django
shows them as they are; under ``USE_TZ = True`` it converts to the current time zone. This
app's fields give aware UTC times under either setting, so without care its pages showed UTC
beside the project's local times."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.utils import display_for_field
from django.contrib.auth.models import User
from django.db import models
from django.urls import reverse
from django.utils import timezone

from django_debounce import dbtime
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.summary import summarize
from django_debounce.testing import run_due
from tests.testapp.tasks import record, record_slow

pytestmark = pytest.mark.django_db(transaction=True)
SUMMARY = "admin:django_debounce_debouncekey_summary"


@pytest.fixture(
    params=[(False, "America/New_York"), (True, "Asia/Kolkata")],
    ids=["USE_TZ=False-New_York", "USE_TZ=True-Kolkata"],
)
def zone(request, settings) -> str:
    """The site's settings; returns the zone's name. Neither zone is UTC at any hour (Kolkata
    is +05:30)."""
    settings.USE_TZ, settings.TIME_ZONE = request.param
    return request.param[1]


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


def as_django_shows(value: datetime) -> str:
    """``value`` as Django's admin shows a ``DateTimeField`` of the project's own models under
    the current settings: the field holds what the database holds (``dbtime.to_db``)."""
    return display_for_field(dbtime.to_db(value), models.DateTimeField(), "-")


def readonly(page, field: str) -> tuple[str, str]:
    """(label, text) of the read-only ``field`` on a change page."""
    found = re.search(
        rf'field-{field}\b.*?<label>(.*?):?</label>.*?<div class="readonly">(.*?)</div>',
        page.content.decode(),
        re.S,
    )
    assert found, f"no read-only field {field!r}"
    return html.unescape(found[1]), html.unescape(found[2])


def cell(page, field: str) -> str:
    """The text of the first row's ``field`` column on a changelist."""
    found = re.search(
        rf'<t[dh] class="field-{field}\b[^"]*"[^>]*>(.*?)</t[dh]>', page.content.decode()
    )
    assert found, f"no column {field!r}"
    return html.unescape(re.sub(r"<[^>]+>", "", found[1]))


def test_key_page_times_are_local_and_labelled(operator, eager, zone):
    record_slow.trigger("tz")  # a long wait: pending, with its times set
    record.trigger("ran")
    assert run_due(now=dbtime.now() + timedelta(seconds=1)) == 1
    pending = DebounceKey.objects.get(task_name=record_slow.name)
    page = operator.get(reverse("admin:django_debounce_debouncekey_change", args=[pending.pk]))
    for field in ("first_trigger_at", "last_trigger_at", "due_at", "created_at"):
        label, text = readonly(page, field)
        assert text == as_django_shows(getattr(pending, field)), field
        assert label.endswith(f"({zone})"), label

    ran = DebounceKey.objects.get(task_name=record.name)
    run = DebounceRun.objects.get(debounce_key=ran)
    page = operator.get(reverse("admin:django_debounce_debouncekey_change", args=[ran.pk]))
    content = page.content.decode()
    assert f"<th>started ({zone})</th>" in content
    started = timezone.localtime(run.started_at, timezone.get_default_timezone())
    assert f"<td>{started:%Y-%m-%d %H:%M:%S}</td>" in content


def test_runs_list_and_run_page_times_are_local_and_labelled(operator, eager, zone):
    record.trigger("ran")
    assert run_due(now=dbtime.now() + timedelta(seconds=1)) == 1
    run = DebounceRun.objects.get()
    page = operator.get(reverse("admin:django_debounce_debouncerun_changelist"))
    assert cell(page, "started_at") == as_django_shows(run.started_at)
    assert f"Started ({zone})" in page.content.decode()
    page = operator.get(reverse("admin:django_debounce_debouncerun_change", args=[run.pk]))
    for field in ("started_at", "finished_at", "due_at"):
        label, text = readonly(page, field)
        assert text == as_django_shows(getattr(run, field)), field
        assert label.endswith(f"({zone})"), label


def test_summary_period_and_chart_are_local_and_labelled(operator, eager, zone):
    record.trigger("x")
    run_due(now=dbtime.now() + timedelta(seconds=1))
    page = operator.get(reverse(SUMMARY))  # 24 h in hourly buckets, labelled "%H:%M"
    summary = page.context["summary"]
    local = timezone.get_default_timezone()  # the site's zone under either setting here
    since, until = (timezone.localtime(t, local) for t in (summary.since, summary.until))
    content = page.content.decode()
    assert f"{since:%Y-%m-%d %H:%M} – {until:%Y-%m-%d %H:%M} {zone}" in content
    first_bucket = timezone.localtime(summary.bucket_starts[0], local)
    assert f">{first_bucket:%H:%M}</text>" in content  # the chart's first axis label
    assert f"times in {zone}</text>" in content
    # The run (started a second ahead) is counted in the last bucket of the next minute's day.
    later = summarize("24h", now=dbtime.now() + timedelta(minutes=1))
    assert later.totals.runs == later.totals.bucket_runs[-1] == 1


def test_summary_buckets_across_a_daylight_saving_change(zone):
    """New York's clocks went forward at 02:00 on 2025-03-09: the 24 hours before noon that
    day are 25 hours of wall clock. A run half an hour before noon is in the last hourly
    bucket under either ``USE_TZ`` (stored naive in ``TIME_ZONE`` without it)."""
    noon = datetime(2025, 3, 9, 16, 0, tzinfo=UTC)  # 12:00 EDT, 21:30 in Kolkata
    key = DebounceKey.objects.create(task_name=record.name, key="dst", key_hash="d" * 64)
    for n, started in enumerate([noon - timedelta(minutes=30), noon - timedelta(hours=23.5)]):
        DebounceRun.objects.create(
            debounce_key=key,
            task_name=record.name,
            flight_id=n + 1,
            run_id=n + 1,
            triggers=1,
            first_trigger_at=started,
            last_trigger_at=started,
            due_at=started,
            started_at=started,
            delay=0.0,
            finished_at=started,
            outcome="success",
        )
    summary = summarize("24h", now=noon)
    assert summary.totals.runs == 2
    assert summary.totals.bucket_runs[0] == summary.totals.bucket_runs[-1] == 1
