"""The per-task summary page: figures checked against generated run history, a constant
number of queries whatever the table sizes, inline SVG only, view permission."""

from __future__ import annotations

import random
import re
import statistics
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.summary import SQLITE_DELAY_INDEX, percentile_positions, summarize

pytestmark = pytest.mark.django_db
SUMMARY = "admin:django_debounce_debouncekey_summary"
CHANGELIST = "admin:django_debounce_debouncekey_changelist"


def make_key(task: str, key: str, **fields) -> DebounceKey:
    return DebounceKey.objects.create(
        task_name=task, key=key, key_hash=f"{task}:{key}"[:64], **fields
    )


def make_runs(key: DebounceKey, delays, *, ago: timedelta, spread: timedelta, outcome="success"):
    """One run per delay, started between ``ago`` and ``ago - spread`` before now; run ``i``
    covers ``i % 7 + 1`` triggers."""
    now = timezone.now()
    start = now - ago
    step = spread / max(len(delays), 1)
    base = DebounceRun.objects.filter(debounce_key=key).count()
    rows = []
    for i, delay in enumerate(delays):
        started = start + step * i
        rows.append(
            DebounceRun(
                debounce_key=key,
                task_name=key.task_name,
                flight_id=base + i + 1,
                run_id=base + i + 1,
                triggers=i % 7 + 1,
                first_trigger_at=started - timedelta(seconds=delay + 1),
                last_trigger_at=started - timedelta(seconds=delay),
                due_at=started,
                started_at=started,
                delay=delay,
                finished_at=started + timedelta(seconds=0.1),
                outcome=outcome,
            )
        )
    DebounceRun.objects.bulk_create(rows, batch_size=1000)
    return rows


def expected_percentile(values, fraction):
    ordered = sorted(values)
    low, high, weight = percentile_positions(len(ordered), fraction)
    return ordered[low - 1] + (ordered[high - 1] - ordered[low - 1]) * weight


@pytest.fixture
def history():
    rng = random.Random(5)
    a = make_key("shop.reindex", "a", state="pending", pending=3)
    b = make_key("shop.webhook", "b")
    delays_a = [round(rng.uniform(0.1, 40), 3) for _ in range(257)]
    delays_b = [round(rng.expovariate(0.5), 3) for _ in range(64)]
    runs_a = make_runs(a, delays_a, ago=timedelta(hours=20), spread=timedelta(hours=19))
    make_runs(b, delays_b, ago=timedelta(hours=3), spread=timedelta(hours=2))
    # Outside the period, a failure and a lost run inside it.
    make_runs(a, [999.0] * 5, ago=timedelta(days=3), spread=timedelta(hours=1))
    make_runs(b, [7.5], ago=timedelta(minutes=30), spread=timedelta(0), outcome="failure")
    make_runs(b, [500.0], ago=timedelta(minutes=20), spread=timedelta(0), outcome="lost")
    make_runs(b, [600.0] * 2, ago=timedelta(minutes=10), spread=timedelta(0), outcome="retry")
    return {
        "a": (delays_a, sum(r.triggers for r in runs_a)),
        "b": ([*delays_b, 7.5], sum(i % 7 + 1 for i in range(64)) + 1),
    }


def test_percentile_positions_interpolate_like_percentile_cont():
    assert percentile_positions(1, 0.5) == (1, 1, 0.0)
    assert percentile_positions(4, 0.5) == (2, 3, 0.5)
    low, high, weight = percentile_positions(101, 0.95)
    assert (low, high) == (96, 97) and weight == pytest.approx(0.0)
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    assert expected_percentile(values, 0.5) == pytest.approx(statistics.median(values))
    inclusive = statistics.quantiles(values, n=100, method="inclusive")
    assert expected_percentile(values, 0.95) == pytest.approx(inclusive[94])


def test_summary_figures_match_the_generated_history(history):
    data = summarize("24h")
    by_task = {t.task_name: t for t in data.tasks}
    assert list(by_task) == ["shop.reindex", "shop.webhook"]  # most triggers first
    reindex, webhook = by_task["shop.reindex"], by_task["shop.webhook"]
    delays_a, triggers_a = history["a"]
    delays_b, triggers_b = history["b"]
    assert (reindex.runs, reindex.triggers, reindex.failures, reindex.lost) == (
        257,
        triggers_a,
        0,
        0,
    )
    assert (webhook.runs, webhook.triggers, webhook.failures, webhook.lost) == (
        65,
        triggers_b,
        1,
        1,
    )
    assert (webhook.retried, reindex.retried, data.totals.retried) == (2, 0, 2)
    assert reindex.ratio == pytest.approx(triggers_a / 257)
    assert reindex.merged == triggers_a - 257
    assert (reindex.active_keys, webhook.active_keys) == (1, 0)
    for task, delays in ((reindex, delays_a), (webhook, delays_b)):
        assert task.median_delay == pytest.approx(statistics.median(delays))
        assert task.p95_delay == pytest.approx(
            statistics.quantiles(delays, n=100, method="inclusive")[94]
        )
    # The chart buckets add up to the table, and the totals to the tasks.
    assert sum(reindex.bucket_runs) == 257 and sum(reindex.bucket_triggers) == triggers_a
    assert len(data.bucket_starts) == 24
    assert data.totals.runs == 257 + 65
    assert sum(data.totals.bucket_triggers) == triggers_a + triggers_b


if settings.DB_VENDOR == "sqlite":

    def test_offset_percentiles_without_the_sqlite_index(history):
        """A later migration that rebuilds the table on SQLite drops the index migration 0003
        made: the summary still answers, without the index hint."""
        expected = summarize("24h").tasks[0].median_delay
        with connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX {SQLITE_DELAY_INDEX}")
        try:
            assert summarize("24h").tasks[0].median_delay == expected
        finally:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"CREATE INDEX {SQLITE_DELAY_INDEX} ON django_debounce_debouncerun "
                    "(task_name, delay, started_at, outcome)"
                )


def test_period_selects_runs(history):
    assert [t.task_name for t in summarize("1h").tasks if t.runs] == ["shop.webhook"]
    week = {t.task_name: t for t in summarize("7d").tasks}
    assert week["shop.reindex"].runs == 257 + 5


def test_tasks_are_paginated(history):
    for i in range(5):
        key = make_key(f"extra.t{i}", "k")
        make_runs(key, [1.0], ago=timedelta(hours=1), spread=timedelta(0))
    first = summarize("24h", per_page=3)
    second = summarize("24h", page=3, per_page=3)
    assert (first.pages, first.task_count, len(first.tasks)) == (3, 7, 3)
    assert len(second.tasks) == 1
    assert second.tasks[0].median_delay == pytest.approx(1.0)


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw"))
    return client


def test_summary_page_renders_inline_svg_and_is_linked_from_the_keys(operator, history):
    keys = operator.get(reverse(CHANGELIST))
    assert reverse(SUMMARY) in keys.content.decode()
    page = operator.get(reverse(SUMMARY), {"period": "24h"})
    assert page.status_code == 200
    html = page.content.decode()
    content = html.split('id="content-main"')[1]
    assert content.count('<svg class="debounce-chart"') == 1
    assert content.count('<svg class="debounce-sparkline"') == 2  # one per task
    assert "<script" not in content and "<image" not in content and 'href="http' not in content
    assert 'data-task="shop.reindex"' in html
    assert page.context["summary"].tasks[0].runs == 257
    assert operator.get(reverse(SUMMARY), {"period": "bogus", "p": "x"}).status_code == 200


def test_summary_needs_view_permission(client, history):
    user = User.objects.create_user("clerk", "c@example.com", "pw", is_staff=True)
    client.force_login(user)
    assert client.get(reverse(SUMMARY)).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_debouncekey"))
    assert client.get(reverse(SUMMARY)).status_code == 200


def _count_queries(client, url, params=None) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url, params or {}).status_code == 200
    return len(ctx.captured_queries)


def test_summary_and_changelist_queries_do_not_grow_with_the_tables(
    operator, django_assert_max_num_queries
):
    key = make_key("shop.reindex", "first", state="pending", pending=1)
    make_runs(key, [1.0, 2.0], ago=timedelta(hours=2), spread=timedelta(hours=1))
    small_summary = _count_queries(operator, reverse(SUMMARY))
    small_keys = _count_queries(operator, reverse(CHANGELIST))
    small_key_page = _count_queries(
        operator, reverse("admin:django_debounce_debouncekey_change", args=[key.pk])
    )
    for i in range(60):
        k = make_key(f"task.{i % 4}", f"k{i}", state="pending" if i % 3 else "idle", pending=i)
        make_runs(
            k, [float(j) for j in range(30)], ago=timedelta(hours=5), spread=timedelta(hours=4)
        )
    make_runs(key, [3.0] * 40, ago=timedelta(minutes=50), spread=timedelta(minutes=40))
    with django_assert_max_num_queries(small_summary):
        operator.get(reverse(SUMMARY))
    with django_assert_max_num_queries(small_keys):
        operator.get(reverse(CHANGELIST))
    with django_assert_max_num_queries(small_key_page):
        operator.get(reverse("admin:django_debounce_debouncekey_change", args=[key.pk]))
    # Session and user, then the summary's own statements: three on PostgreSQL, four on SQLite.
    assert small_summary <= 6, small_summary


def breadcrumbs(page) -> tuple[str, str, list[str]]:
    """(tag, class, texts of the items) of the breadcrumbs in a page's navigation."""
    found = re.search(
        r'<nav aria-label="Breadcrumbs">\s*<(\w+) class="([^"]+)">(.*?)</\1>',
        page.content.decode(),
        re.S,
    )
    assert found, "no breadcrumbs"
    tag, css, inner = found.groups()
    items = re.findall(r"<li[^>]*>(.*?)</li>", inner, re.S) if tag == "ol" else []
    return tag, css, [re.sub(r"<[^>]+>", "", item).strip() for item in items]


def test_summary_breadcrumbs_have_the_markup_of_djangos_own_pages(operator):
    """The summary's breadcrumbs are built as those of Django's own changelist (a ``div``
    before Django 6.1, a list since, which its stylesheet styles), so they are styled."""
    own_tag, own_class, own_items = breadcrumbs(operator.get(reverse(CHANGELIST)))
    tag, css, items = breadcrumbs(operator.get(reverse(SUMMARY)))
    assert (tag, css) == (own_tag, own_class)
    if tag == "ol":  # Django >= 6.1: one item per step, the page itself last
        assert items == [*own_items, "Summary"]
