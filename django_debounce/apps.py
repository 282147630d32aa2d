from django.apps import AppConfig


class DebounceConfig(AppConfig):
    """App config of django-debounce; registers system checks and the settings-change hook."""

    name = "django_debounce"
    verbose_name = "Debounce"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_debounce import backends, checks  # noqa: F401  (registers checks, signal hooks)
