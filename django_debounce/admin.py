"""Read-only admin pages for keys and runs (operator actions come with the admin issue)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from django_debounce import conf
from django_debounce.models import DebounceKey, DebounceRun


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, no change of state by hand; viewing needs view permission."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class DebounceRunInline(admin.TabularInline):
    model = DebounceRun
    extra = 0
    can_delete = False
    fields = ("run_id", "flight_id", "triggers", "started_at", "delay", "finished_at", "outcome", "error")
    readonly_fields = fields
    ordering = ("-run_id",)
    max_num = 0

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class DebounceKeyAdmin(ReadOnlyAdmin):
    list_display = (
        "key", "task_name", "state", "pending", "flight_id", "triggers", "runs", "merged",
        "due_at", "last_run_at", "last_outcome",
    )
    list_filter = ("state", "task_name")
    search_fields = ("key", "task_name")
    readonly_fields = [f.name for f in DebounceKey._meta.fields]
    inlines = [DebounceRunInline]


class DebounceRunAdmin(ReadOnlyAdmin):
    list_display = (
        "task_name", "debounce_key", "run_id", "flight_id", "triggers", "started_at", "delay",
        "finished_at", "outcome",
    )
    list_filter = ("outcome", "task_name")
    list_select_related = ("debounce_key",)
    readonly_fields = [f.name for f in DebounceRun._meta.fields]


if conf.get("ADMIN_ENABLED"):
    admin.site.register(DebounceKey, DebounceKeyAdmin)
    admin.site.register(DebounceRun, DebounceRunAdmin)
