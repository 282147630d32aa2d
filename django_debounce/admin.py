"""Admin pages for keys and runs: read-only, with operator actions that need change permission."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename
from django.http import HttpRequest
from django.utils import timezone

from django_debounce import conf
from django_debounce.backends import get_backend
from django_debounce.exceptions import UnknownTask
from django_debounce.models import DebounceKey, DebounceRun
from django_debounce.tasks import get_debounced_task

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
    actions = ["run_now", "cancel_pending", "purge_idle"]

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Operator actions need the model's change permission; the page itself stays
        read-only (the state is the stores' to change, never a form's)."""
        opts = self.opts
        codename = get_permission_codename("change", opts)
        return bool(request.user.has_perm(f"{opts.app_label}.{codename}"))

    def _tasks(self, request: HttpRequest, queryset: Any) -> list[tuple[Any, DebounceKey]]:
        """Selected rows with their task; a task name that is not a registered debounced
        task is never dispatched."""
        out = []
        for row in queryset:
            try:
                out.append((get_debounced_task(row.task_name), row))
            except UnknownTask as exc:
                self.message_user(request, str(exc), messages.WARNING)
        return out

    @admin.action(description="Run now", permissions=["operate"])
    def run_now(self, request: HttpRequest, queryset: Any) -> None:
        count = sum(
            1 for task, row in self._tasks(request, queryset) if task.flush_key(row.key_hash)
        )
        self.message_user(request, f"{count} key(s) with pending triggers will run now.")

    @admin.action(description="Cancel pending triggers", permissions=["operate"])
    def cancel_pending(self, request: HttpRequest, queryset: Any) -> None:
        keys = dropped = 0
        for task, row in self._tasks(request, queryset):
            n = task.get_backend().cancel(row.key_hash)
            keys += 1 if n else 0
            dropped += n
        self.message_user(request, f"Cancelled {dropped} pending trigger(s) on {keys} key(s).")

    @admin.action(description="Purge idle keys", permissions=["operate"])
    def purge_idle(self, request: HttpRequest, queryset: Any) -> None:
        deleted = queryset.delete_stale(timezone.now())
        self.message_user(request, f"Purged {deleted} idle key(s) and their run history.")

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
