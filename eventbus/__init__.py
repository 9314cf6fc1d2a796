"""The event bus: exactly-once publish (L1), the ordered router (L2, L3) and the reclaimer.

`publish_event`, `publish_events`, the job services (`start_job`, `cancel_job`, `retry_job`) and
their exceptions are imported on first use: importing
the package (INSTALLED_APPS, the Celery app) must not pull in Redis clients or settings.
"""

_EXPORTS = {
    "publish_event": "eventbus.publish",
    "publish_events": "eventbus.publish",
    "Event": "eventbus.publish",
    "InvalidEvent": "eventbus.publish",
    "OutOfOrderEvent": "eventbus.publish",
    "start_job": "eventbus.services",
    "cancel_job": "eventbus.services",
    "retry_job": "eventbus.services",
    "JobEnded": "eventbus.exceptions",
    "JobNotRetryable": "eventbus.exceptions",
    "JobLimitReached": "eventbus.exceptions",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'eventbus' has no attribute {name!r}")
