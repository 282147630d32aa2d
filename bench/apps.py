from importlib import import_module

from django.apps import AppConfig
from django.conf import settings


class BenchConfig(AppConfig):
    name = "bench"
    label = "bench"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The tasks and receivers of the benchmark this process serves: the comparison's
        # contenders (bench.contenders), or the scale benchmark's (bench.scale_tasks).
        import_module(getattr(settings, "BENCH_TASKS", "bench.contenders"))
