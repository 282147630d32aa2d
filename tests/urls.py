from django.contrib import admin
from django.urls import path

from django_debounce.admin import DebounceKeyAdmin, DebounceRunAdmin
from django_debounce.models import DebounceKey, DebounceRun

# A second admin site beside the default one, as projects mount for operators: the debounce
# pages it serves link within it (tests/admin/test_django_settings.py).
ops_site = admin.AdminSite(name="ops")
ops_site.register(DebounceKey, DebounceKeyAdmin)
ops_site.register(DebounceRun, DebounceRunAdmin)

urlpatterns = [path("admin/", admin.site.urls), path("ops/", ops_site.urls)]
