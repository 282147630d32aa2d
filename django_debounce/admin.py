"""Admin pages for keys and runs: read-only, with operator actions that need change
permission, and a per-task summary (docs/design.md, "Models, admin, commands and
signals")."""

from __future__ import annotations

from typing import Any

import django
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from django_debounce import admin_times, charts, conf, dbtime, display, live, registry
from django_debounce.backends import get_backend
from django_debounce.exceptions import UnknownTask
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.state import FlightOptions
from django_debounce.summary import DEFAULT_PERIOD, PERIODS, summarize

# Runs listed on a key's page (the rest are one click away, in the runs list).
RECENT_RUNS = 20
# Longer keys are cut in the lists (whole in the tooltip and on the key's or run's page).
KEY_CHARS = 40


def short_key(whole: str, task_name: str) -> str:
    """A key for a list: without the task's name (a column of its own; default keys start
    with ``"<task name>:"``), cut to ``KEY_CHARS`` characters with the whole key in its
    tooltip."""
    text = whole.removeprefix(f"{task_name}:")
    if len(text) <= KEY_CHARS:
        return text
    return format_html('<span title="{}">{}</span>', whole, display.cut(text, KEY_CHARS))


@admin.display(description=_("duration"))
def duration(run: DebounceRun) -> str:
    """A run's duration, from its start to its end, as "4.9 s" (empty while it runs)."""
    if run.finished_at is None:
        return ""
    return display.duration((run.finished_at - run.started_at).total_seconds())


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, no change of state by hand; viewing needs view permission. Every time field
    is shown in the zone Django shows its own times in, with the zone in its heading
    (``admin_times``)."""

    def __init__(self, model: type[Any], admin_site: admin.AdminSite) -> None:
        super().__init__(model, admin_site)
        self.time_columns = admin_times.time_columns(model, self.get_empty_value_display())

    def _local_times(self, names: Any) -> list[Any]:
        """``names`` (of a list display or a fieldset) with each time field's name replaced
        by its ``admin_times.time_column``; nested tuples (fields on one line) too."""
        return [
            tuple(self._local_times(name))
            if isinstance(name, (list, tuple))
            else self.time_columns.get(name, name)
            if isinstance(name, str)
            else name
            for name in names
        ]

    def get_list_display(self, request: HttpRequest) -> Any:
        return self._local_times(super().get_list_display(request))

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # Every field is read-only: there is no form to take them from.
        return self.fields or list(dict.fromkeys(self.get_readonly_fields(request, obj)))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return [
            (name, {**options, "fields": self._local_times(options["fields"])})
            for name, options in super().get_fieldsets(request, obj)
        ]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # keys and runs go through debounce_purge, never by hand


class TaskFilter(admin.SimpleListFilter):
    """By task; the choices come from the keys table (indexed on the task name), never from
    the much larger run history."""

    title = _("task")
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = (
            DebounceKey.objects.order_by("task_name").values_list("task_name", flat=True).distinct()
        )
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(task_name=value) if value else queryset


class LiveChangeList(ChangeList):
    """After pagination, add to the rows on screen the triggers their Redis counters
    absorbed, in one pipeline (derived: a claim folds them into the row)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        live.refresh(list(self.result_list))


class DebounceKeyAdmin(ReadOnlyAdmin):
    list_display = (
        "key_text",
        "task_name",
        "state",
        "live_pending",
        "triggers",
        "merged",
        "runs",
        "first_trigger",
        "last_trigger",
        "fires",
        "last_run",
    )
    list_filter = ("state", TaskFilter)
    search_fields = ("key",)
    fieldsets = (
        (
            None,
            {"fields": ("key", "task_name", "state", "live_pending", "fires", "last_run")},
        ),
        (_("Totals"), {"fields": ("triggers", "merged", "runs", "cancelled")}),
        (_("Recent runs"), {"fields": ("recent_runs",)}),
        (
            _("Open flight"),
            {
                "fields": (
                    "flight_id",
                    "first_trigger_at",
                    "last_trigger_at",
                    "due_at",
                    "anchor_at",
                    "attempt",
                    "not_before",
                    "payload",
                )
            },
        ),
        (
            _("Live run and dispatch"),
            {
                "classes": ("collapse",),
                "fields": (
                    "run_id",
                    "running_until",
                    "run_attempt",
                    "run_triggers",
                    "run_first_trigger_at",
                    "run_payload",
                    "scheduled_seq",
                    "scheduled",
                    "scheduled_at",
                    "counter_id",
                    "counter_until",
                    "overlap",
                    "key_hash",
                    "created_at",
                    "updated_at",
                ),
            },
        ),
    )
    readonly_fields = [
        "live_pending",
        "first_trigger",
        "last_trigger",
        "fires",
        "last_run",
        "recent_runs",
        *(f.name for f in DebounceKey._meta.fields),
    ]
    actions = ["run_now", "cancel_pending", "purge_idle"]
    # Facet counts would be one COUNT per filter choice: not on tables this size.
    show_facets = admin.ShowFacets.NEVER

    # -- permissions and actions ------------------------------------------------------------

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Operator actions need the model's change permission; the page itself stays
        read-only (the state is the stores' to change, never a form's)."""
        opts = self.opts
        codename = get_permission_codename("change", opts)
        return bool(request.user.has_perm(f"{opts.app_label}.{codename}"))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        """The list of keys; an action posted without change permission is refused (403)
        before Django's own handling, which would ignore it silently."""
        if (
            request.method == "POST"
            and "action" in request.POST
            and not self.has_operate_permission(request)
        ):
            raise PermissionDenied("Debounce actions need the change permission on keys.")
        return super().changelist_view(request, extra_context)

    def _tasks(self, request: HttpRequest, queryset: Any) -> list[tuple[Any, DebounceKey]]:
        """Selected rows with their task; a task name that is not a registered debounced
        task is never dispatched."""
        out = []
        unknown: dict[str, int] = {}
        for row in queryset:
            try:
                out.append((registry.get(row.task_name), row))
            except UnknownTask:
                unknown[row.task_name] = unknown.get(row.task_name, 0) + 1
        if unknown:
            self.message_user(
                request,
                f"Skipped {sum(unknown.values())} key(s) of tasks that are not registered "
                f"debounced tasks here: {', '.join(sorted(unknown))}. Import the modules that "
                'define them; for a task that was removed or renamed, use "Cancel pending '
                'triggers", then purge.',
                messages.WARNING,
            )
        return out

    @admin.action(description=_("Run now"), permissions=["operate"])
    def run_now(self, request: HttpRequest, queryset: Any) -> None:
        """Make the pending flight of each selected key due now (a live run finishes first)."""
        count = sum(
            1 for task, row in self._tasks(request, queryset) if task.flush_key(row.key_hash)
        )
        self.message_user(request, f"{count} key(s) with pending triggers will run now.")

    @admin.action(description=_("Cancel pending triggers"), permissions=["operate"])
    def cancel_pending(self, request: HttpRequest, queryset: Any) -> None:
        """Drop the pending triggers of each selected key (a live run goes on)."""
        keys = dropped = 0
        for row in queryset:
            # Cancelling dispatches nothing, so keys of tasks that are no longer registered
            # (removed or renamed) are cancelled too.
            try:
                n = registry.get(row.task_name).cancel_key(row.key_hash)
            except UnknownTask:
                n = get_backend().cancel(
                    row.key_hash, task_name=row.task_name, options=FlightOptions(wait=0.0)
                )
            keys += 1 if n else 0
            dropped += n
        self.message_user(request, f"Cancelled {dropped} pending trigger(s) on {keys} key(s).")

    @admin.action(description=_("Purge idle keys"), permissions=["operate"])
    def purge_idle(self, request: HttpRequest, queryset: Any) -> None:
        """Delete the selected keys that are idle (nothing pending or running), with their
        run history."""
        deleted = queryset.delete_stale(dbtime.now())
        self.message_user(request, f"Purged {deleted} idle key(s) and their run history.")

    # -- live values ------------------------------------------------------------------------

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        """The changelist that reads live values for the rows on screen."""
        return LiveChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        """The key, with the triggers its Redis counter absorbed."""
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            live.refresh([obj])
        return obj

    @admin.display(description=_("key"), ordering="key")
    def key_text(self, obj: DebounceKey) -> str:
        """The key as ``short_key`` shows it (whole on the key's page)."""
        return short_key(obj.key, obj.task_name)

    @admin.display(description=_("pending (live)"), ordering="pending")
    def live_pending(self, obj: DebounceKey) -> int:
        """Pending triggers now (the row's, and those a Redis counter absorbed)."""
        if not hasattr(obj, "live_pending"):
            live.refresh([obj])
        return obj.live_pending  # type: ignore[attr-defined]

    @admin.display(description=_("first trigger"), ordering="first_trigger_at")
    def first_trigger(self, obj: DebounceKey) -> str:
        """First trigger of the open flight, as "12 s ago"."""
        return display.ago(obj.first_trigger_at, dbtime.now())

    @admin.display(description=_("last trigger"), ordering="last_trigger_at")
    def last_trigger(self, obj: DebounceKey) -> str:
        """Last trigger (of the open flight, else of the last claimed one), as "12 s ago"."""
        return display.ago(obj.last_trigger_at, dbtime.now())

    @admin.display(description=_("fires"), ordering="due_at")
    def fires(self, obj: DebounceKey) -> str:
        """When the open flight runs: "in 12 s", "now", "overdue 3 s", "after the live run"."""
        return display.fire_time(obj, dbtime.now())

    @admin.display(description=_("last run"), ordering="last_run_at")
    def last_run(self, obj: DebounceKey) -> str:
        """When the last run started and how it ended: "3 min ago: success"."""
        if obj.last_run_at is None:
            return ""
        when = display.ago(obj.last_run_at, dbtime.now())
        return f"{when}: {obj.last_outcome}" if obj.last_outcome else when

    @admin.display(description=_("recent runs"))
    def recent_runs(self, obj: DebounceKey) -> str:
        """The key's most recent runs as a table, with a link to all of them."""
        runs = list(obj.run_history.order_by("-started_at", "-id")[:RECENT_RUNS])
        if not runs:
            return "no runs yet"
        rows = [
            (
                run.run_id,
                run.flight_id,
                run.triggers,
                run.merged,
                admin_times.local(run.started_at).strftime("%Y-%m-%d %H:%M:%S"),
                display.duration(run.delay),
                duration(run),
                run.outcome,
                run.error[:200],
            )
            for run in runs
        ]
        all_runs = reverse(f"{self.admin_site.name}:django_debounce_debouncerun_changelist")
        return render_to_string(
            "admin/django_debounce/recent_runs.html",
            {
                "rows": rows,
                "started": admin_times.labelled(_("started")),
                "all_runs": f"{all_runs}?debounce_key__id__exact={obj.pk}",
            },
        )

    # -- the summary page -----------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        summary = path(
            "summary/",
            self.admin_site.admin_view(self.summary_view),
            name="django_debounce_debouncekey_summary",
        )
        return [summary, *super().get_urls()]

    def summary_view(self, request: HttpRequest) -> HttpResponse:
        """Per task over a chosen period: triggers in, runs out, coalescing ratio, median and
        95th percentile trigger-to-start delay, and a chart (inline SVG). Needs view
        permission on keys."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        # links resolve into the admin site that serves the page, as Django's own views do
        request.current_app = self.admin_site.name
        period = request.GET.get("period", DEFAULT_PERIOD)
        if period not in PERIODS:
            period = DEFAULT_PERIOD
        data = summarize(period, page=request.GET.get("p"))
        length, width = PERIODS[period]
        fmt = "%b %d" if width.days else "%b %d %H:%M" if length.days > 1 else "%H:%M"
        # Buckets, period and chart in the zone Django shows times in, named on the page.
        labels = [admin_times.local(start).strftime(fmt) for start in data.bucket_starts]
        zone = str(admin_times.zone())
        keys = reverse(
            "admin:django_debounce_debouncekey_changelist", current_app=self.admin_site.name
        )
        rows = [
            {
                "task": task,
                "median": display.duration(task.median_delay),
                "p95": display.duration(task.p95_delay),
                "sparkline": charts.sparkline(task.bucket_triggers, task.bucket_runs, labels),
                "keys_url": f"{keys}?{urlencode({'task': task.task_name})}",
            }
            for task in data.tasks
        ]
        bucket = display.duration(data.bucket_width.total_seconds())
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Debounce summary per task"),
            "summary": data,
            "rows": rows,
            "periods": list(PERIODS),
            "chart": charts.bar_chart(
                data.totals.bucket_triggers,
                data.totals.bucket_runs,
                labels,
                caption=f"triggers in and runs out per {bucket}, times in {zone}",
                note=f"times in {zone}",
            ),
            "since": admin_times.local(data.since).strftime("%Y-%m-%d %H:%M"),
            "until": admin_times.local(data.until).strftime("%Y-%m-%d %H:%M"),
            "zone": zone,
            "bucket": bucket,
            "page_range": range(1, data.pages + 1),
            "breadcrumbs_as_list": django.VERSION >= (6, 1),
        }
        return TemplateResponse(request, "admin/django_debounce/summary.html", context)


class DebounceRunAdmin(ReadOnlyAdmin):
    # At a glance, beside the admin's sidebar and filters on a 1280 px screen: the outcome
    # first after the key (which is without its task, a column of its own), compact columns
    # (delay and duration as "4.9 s"); the finish time and the flight id are on the run's page.
    list_display = (
        "task_name",
        "key",
        "outcome",
        "started_at",
        "run_delay",
        duration,
        "triggers",
        "merged",
        "run_id",
        "attempt",
    )
    list_filter = ("outcome", TaskFilter)
    list_select_related = ("debounce_key",)
    search_fields = ("debounce_key__key",)
    show_full_result_count = False  # one COUNT over the history per page view, not two
    show_facets = admin.ShowFacets.NEVER
    readonly_fields = ["merged", *(f.name for f in DebounceRun._meta.fields)]

    @admin.display(description=_("key"), ordering="debounce_key__key")
    def key(self, obj: DebounceRun) -> str:
        """The run's key as ``short_key`` shows it."""
        return short_key(obj.debounce_key.key, obj.task_name)

    @admin.display(description=_("delay"), ordering="delay")
    def run_delay(self, obj: DebounceRun) -> str:
        """From the last claimed trigger to the start, as "4.9 s"."""
        return display.duration(obj.delay)


if conf.get("ADMIN_ENABLED"):
    admin.site.register(DebounceKey, DebounceKeyAdmin)
    admin.site.register(DebounceRun, DebounceRunAdmin)
