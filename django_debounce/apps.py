from django.apps import AppConfig


class DebounceConfig(AppConfig):
    """App config of django-debounce: registers the system checks, the settings-change hook,
    the ``django_debounce.trigger`` task and the worker bootstep (pump, lease keeper)."""

    name = "django_debounce"
    verbose_name = "Debounce"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from celery.signals import celeryd_init

        # In ready(), as Django asks of imports made for their side effects (the checks, the
        # setting_changed hook, the task): apps.py itself is imported while the app registry
        # is still being populated.
        from django_debounce import backends, canvas, checks, worker  # noqa: F401

        celeryd_init.connect(worker.add_step, dispatch_uid="django_debounce.worker")
