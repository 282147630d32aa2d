"""Read-only admin pages for keys and runs (operator actions come with the admin issue)."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest

from django_debounce import conf
from django_debounce.backends import get_backend
from django_debounce.models import DebounceKey, DebounceRun

logger = logging.getLogger("django_debounce")


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, no change of state by hand; viewing needs view permission."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # keys and runs go through debounce_purge, never by hand


class DebounceRunInline(admin.TabularInline):
    model = DebounceRun
    extra = 0
    can_delete = False
    fields = (
        "run_id",
        "flight_id",
        "triggers",
        "started_at",
        "delay",
        "finished_at",
        "outcome",
        "error",
    )
    readonly_fields = fields
    ordering = ("-run_id",)
    max_num = 0

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class LivePendingChangeList(ChangeList):
    """After pagination, read the live pending counts of the rows on screen in one call
    (one Redis pipeline for keys the Redis store holds; their rows are written only on
    flight transitions)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        try:
            counts = get_backend().pending_counts([row.key_hash for row in rows])
        except Exception:  # the page still shows the durable record when Redis is down
            logger.warning("django_debounce: live pending counts unavailable", exc_info=True)
            counts = {}
        for row in rows:
            row.live_pending = counts.get(row.key_hash, row.pending)


class DebounceKeyAdmin(ReadOnlyAdmin):
    list_display = (
        "key",
        "task_name",
        "state",
        "live_pending",
        "flight_id",
        "triggers",
        "runs",
        "merged",
        "due_at",
        "last_run_at",
        "last_outcome",
    )
    list_filter = ("state", "task_name", "store")
    search_fields = ("key", "task_name")
    readonly_fields = ["live_pending", *(f.name for f in DebounceKey._meta.fields)]
    inlines = [DebounceRunInline]

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return LivePendingChangeList

    @admin.display(description="pending (live)")
    def live_pending(self, obj: DebounceKey) -> int:
        if hasattr(obj, "live_pending"):
            return obj.live_pending
        try:
            live = get_backend().live_state(obj.key_hash)
        except Exception:
            return obj.pending
        return live["pending"] if live else obj.pending


class DebounceRunAdmin(ReadOnlyAdmin):
    list_display = (
        "task_name",
        "debounce_key",
        "run_id",
        "flight_id",
        "triggers",
        "started_at",
        "delay",
        "finished_at",
        "outcome",
    )
    list_filter = ("outcome", "task_name")
    list_select_related = ("debounce_key",)
    readonly_fields = [f.name for f in DebounceRun._meta.fields]


if conf.get("ADMIN_ENABLED"):
    admin.site.register(DebounceKey, DebounceKeyAdmin)
    admin.site.register(DebounceRun, DebounceRunAdmin)
