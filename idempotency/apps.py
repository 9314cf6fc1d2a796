from django.apps import AppConfig


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import (
            checks,  # noqa: F401  (registers the system checks)
            signals,
        )

        signals.connect()
