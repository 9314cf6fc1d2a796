"""The event bus's app, shown in the admin as "Jobs" (jobs, their stage records, dead letters)."""

from django.apps import AppConfig


class EventbusConfig(AppConfig):
    name = "eventbus"
    verbose_name = "Jobs"

    def ready(self):
        # The system checks, and the metrics in the default registry (served at /metrics).
        from django.utils.module_loading import autodiscover_modules

        from eventbus import checks, metrics  # noqa: F401

        # Job types registered with @register live in the apps' `jobs` modules (the bus's own
        # running of jobs is eventbus.job.runs: no `jobs` module of its own is imported here).
        autodiscover_modules("jobs")

        # A Celery worker started in this process gets the pool's guard (eventbus.adapters.celery).
        from eventbus.adapters import celery as celery_adapter

        celery_adapter.connect()
