from django.apps import AppConfig


class CatalogueConfig(AppConfig):
    name = "example_project.catalogue"
    label = "catalogue"
    verbose_name = "Catalogue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects the receivers and registers the debounced tasks in the web process too
        # (the worker also finds this module through Celery's autodiscover_tasks).
        from example_project.catalogue import tasks  # noqa: F401
