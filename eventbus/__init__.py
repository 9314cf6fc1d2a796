"""The event bus: exactly-once publish (L1), the ordered router (L2, L3) and the reclaimer.

Its public API, importable from here: publishing (`publish_event`, `publish_events`, `Event`
and their errors), the job-type API a project declares its jobs with (`JobType`, `Stage`,
`register` and the exceptions a stage raises or a caller catches: eventbus.jobtypes), `events_of`
to test a job type without Redis or a worker, the job services (`start_job`, `cancel_job`,
`retry_job`) and their exceptions, `enqueue_key` (keyed django.tasks enqueues: eventbus.backends),
`schedule` (a task enqueued periodically: eventbus.djangotasks.schedules), and the settings helpers
for a Sentinel-managed Redis (`celery_broker`, `django_redis_cache`). Each is imported on first
use: importing the package (INSTALLED_APPS, the Celery app, a settings module) must not pull in
models, Redis clients or settings.
"""

_EXPORTS = {
    "publish_event": "eventbus.bus.publish",
    "publish_events": "eventbus.bus.publish",
    "Event": "eventbus.bus.publish",
    "InvalidEvent": "eventbus.bus.publish",
    "OutOfOrderEvent": "eventbus.bus.publish",
    "JobType": "eventbus.jobtypes",
    "Stage": "eventbus.jobtypes",
    "register": "eventbus.jobtypes",
    "InvalidPayload": "eventbus.jobtypes",
    "JobFailed": "eventbus.jobtypes",
    "JobCancelled": "eventbus.jobtypes",
    "StageTimeout": "eventbus.jobtypes",
    "UnknownJobType": "eventbus.jobtypes",
    "events_of": "eventbus.testing",
    "start_job": "eventbus.services",
    "cancel_job": "eventbus.services",
    "retry_job": "eventbus.services",
    "signal_job": "eventbus.services",
    "UnknownSignal": "eventbus.exceptions",
    "SignalAlreadySent": "eventbus.exceptions",
    "enqueue_key": "eventbus.djangotasks.keys",
    "schedule": "eventbus.djangotasks.schedules",
    "JobEnded": "eventbus.exceptions",
    "JobNotRetryable": "eventbus.exceptions",
    "JobLimitReached": "eventbus.exceptions",
    "JobCreationLimitReached": "eventbus.exceptions",
    "JobAlreadyRetried": "eventbus.exceptions",
    "celery_broker": "eventbus.redis.sentinel",
    "django_redis_cache": "eventbus.redis.sentinel",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'eventbus' has no attribute {name!r}")
