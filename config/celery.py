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


def _patch_asynpool() -> None:
    """Celery 5.7 + kombu 5.7 kill a worker that loses its broker connection shortly after one of
    its pool processes died (found by tests/e2e: a pool SIGKILLed mid-job, then CLIENT KILL).

    A pool process whose exit was handled keeps `_sentinel_poll = None` in the pool until billiard
    joins it. When the consumer restarts after a lost broker connection, AsynPool's
    register_with_event_loop tracks every pool process again; for that one kombu's fileno(None)
    raises ValueError, which celery's iterate_file_descriptors_safely does not catch (it expects
    OSError or AttributeError), and the worker exits: "Unrecoverable error: ValueError('file
    descriptor is None')". Such a process is gone: there is nothing to track.
    """
    from celery.concurrency import asynpool

    original = asynpool.AsynPool._track_child_process
    if getattr(original, "_skips_exited", False):
        return

    def _track_child_process(self, proc, hub):
        if getattr(proc, "_sentinel_poll", 0) is None:  # untracked when it exited: it is gone
            return None
        return original(self, proc, hub)

    _track_child_process._skips_exited = True  # type: ignore[attr-defined]
    asynpool.AsynPool._track_child_process = _track_child_process


_patch_asynpool()


@worker_process_shutdown.connect
def _drop_live_gauges(**kwargs) -> None:
    """A pool process leaves with os._exit, past atexit: drop its live gauges from the
    multiprocess metrics files here (eventbus.metrics does it for the other processes)."""
    from eventbus.metrics import mark_process_dead

    mark_process_dead()
