"""The Celery app; its settings are the CELERY_* names in Django's settings."""

from celery import Celery
from celery.signals import worker_process_shutdown

# No default settings module here. This module is imported with the `config` package (its
# __init__), before any entry point's own default: `python -m config.stack` (make run) and
# manage.py choose the dev settings, config.asgi (the web server) production, and a worker
# started without DJANGO_SETTINGS_MODULE refuses to start rather than run on either.

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_shutdown.connect
def _drop_live_gauges(**kwargs) -> None:
    """A pool process leaves with os._exit, past atexit: drop its live gauges from the
    multiprocess metrics files here (eventbus.metrics does it for the other processes)."""
    from eventbus.metrics import mark_process_dead

    mark_process_dead()
