from django.contrib import admin

from example_project.demo.models import DemoRun


@admin.register(DemoRun)
class DemoRunAdmin(admin.ModelAdmin):
    list_display = ["scenario", "doc_pk", "version_seen", "triggers", "started", "finished", "pid"]
    list_filter = ["scenario"]
