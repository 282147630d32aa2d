from django.apps import AppConfig


class DebounceConfig(AppConfig):
    """App config of django-debounce: registers the system checks, the settings-change hook
    and the worker bootstep (pump, lease keeper, recorder)."""

    name = "django_debounce"
    verbose_name = "Debounce"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from celery.signals import celeryd_init

        from django_debounce import (  # noqa: F401  (registers checks, signal hooks, the task)
            backends,
            canvas,
            checks,
        )
        from django_debounce.worker import add_step

        celeryd_init.connect(add_step, dispatch_uid="django_debounce.worker")
