from django.apps import AppConfig


class DebounceConfig(AppConfig):
    """App config of django-debounce; registers system checks and the settings-change hook."""

    name = "django_debounce"
    verbose_name = "Debounce"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from celery.signals import worker_ready

        from django_debounce import backends, checks  # noqa: F401  (registers checks, signal hooks)
        from django_debounce.recovery import recover_on_worker_start

        worker_ready.connect(recover_on_worker_start, dispatch_uid="django_debounce.recover")
