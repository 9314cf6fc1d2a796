"""A cancelled job's flag, where its running stage reads it cheaply.

eventbus.services.cancel_job records the request in the database (Job.cancel_requested_at,
the source of truth: the run reads it before each stage) and sets a Redis key next to the job's
keys, which the running stage reads at each `ctx.report()` and each read of `ctx.cancelled`
(one EXISTS). When Redis cannot answer, the database does.
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from eventbus.bus.keys import JobKeys
from eventbus.conf import eventbus_settings
from eventbus.models import Job
from eventbus.redis.clients import get_redis

logger = logging.getLogger(__name__)


def flag_key(job: Job) -> str:
    return JobKeys(job.domain, str(job.id)).cancel_flag


def set_flag(job: Job) -> None:
    """Best effort: the database holds the request either way."""
    try:
        # Kept as long as a job's state: longer than any run that could still read it.
        get_redis().set(flag_key(job), 1, ex=max(int(eventbus_settings.STATE_TTL), 3600))
    except RedisError:
        logger.warning("Job %s: cancel flag not set in Redis; the run reads the database", job.id)


def requested(job: Job) -> bool:
    """Whether the job was cancelled: Redis's flag, else (Redis away) the database."""
    try:
        return bool(get_redis().exists(flag_key(job)))
    except RedisError:
        return Job.objects.filter(pk=job.pk, cancel_requested_at__isnull=False).exists()
