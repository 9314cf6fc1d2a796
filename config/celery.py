"""The Celery app; its settings are the CELERY_* names in Django's settings."""

from celery import Celery
from celery.signals import worker_process_shutdown

# No default settings module, as no entry point of the demo has one (config.entrypoints): a
# worker started without DJANGO_SETTINGS_MODULE refuses to start (Django's ImproperlyConfigured,
# naming the variable, when Celery's Django fixup reads the settings). Not checked on import:
# this module is imported with the `config` package (its __init__), before `python -m
# config.stack` (make run) sets the variable for the processes it starts.

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_shutdown.connect
def _drop_live_gauges(**kwargs) -> None:
    """A pool process leaves with os._exit, past atexit: drop its live gauges from the
    multiprocess metrics files here (eventbus.metrics does it for the other processes)."""
    from eventbus.metrics import mark_process_dead

    mark_process_dead()
