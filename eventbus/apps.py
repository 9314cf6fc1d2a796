from django.apps import AppConfig


class EventbusConfig(AppConfig):
    name = "eventbus"

    def ready(self):
        # The system checks, and the metrics in the default registry (served at /metrics).
        from django.utils.module_loading import autodiscover_modules

        from . import checks, metrics  # noqa: F401

        # Job types registered with @register live in the apps' `jobs` modules.
        autodiscover_modules("jobs")

        # A Celery worker started in this process gets the pool's guard (eventbus.adapters.celery).
        from .adapters import celery as celery_adapter

        celery_adapter.connect()
