from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "example_project.demo"
    label = "demo"
    verbose_name = "Demo"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from example_project.demo import tasks  # noqa: F401  (connects the demo receivers)
