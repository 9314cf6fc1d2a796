"""Event bus fixtures: settings overrides, a Celery broker on the test Redis and jobs to
run (the Redis Cluster fixtures are the suite's: tests/conftest.py)."""

import os

import pytest
from django.conf import settings
from django.test.utils import override_settings

from .helpers import point_broker


@pytest.fixture
def eventbus_settings_override():
    """override_settings(EVENTBUS=...) on top of the test settings' EVENTBUS."""

    def override(**values):
        return override_settings(EVENTBUS={**getattr(settings, "EVENTBUS", {}), **values})

    return override


@pytest.fixture
def broker(redis_client, redis_url):
    """The Celery app of this process publishes to the test Redis (flushed: no queued tasks)."""
    point_broker(redis_url)
    return redis_client


@pytest.fixture
def make_job(user):
    from eventbus.models import Job

    def make(domain="scan", payload=None, **fields):
        return Job.objects.create(
            scope=f"t:{user.pk}",
            idem_key=fields.pop("idem_key", os.urandom(8).hex()),
            owner=user,
            domain=domain,
            event_type="job.requested",
            payload=payload or {},
            **fields,
        )

    return make
