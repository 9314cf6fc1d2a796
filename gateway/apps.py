from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"

    def ready(self):
        from . import checks  # noqa: F401  (registers them)
