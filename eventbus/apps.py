from django.apps import AppConfig


class EventbusConfig(AppConfig):
    name = "eventbus"

    def ready(self):
        # The system checks, and the metrics in the default registry (served at /metrics).
        from . import checks, metrics  # noqa: F401
