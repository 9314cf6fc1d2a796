"""Recovery: no accepted job stays stranded. The database is the source of truth.

A job neither finished nor running — no run lease in Redis and no sign of life (enqueued, a
stage started or finished) for EVENTBUS["RECOVER_AFTER"] seconds — lost its run: its worker
was killed and its Celery message with it (Redis restarted without it, or it waits in the
broker's unacked set for the visibility timeout), or Redis lost everything. Such a job is
enqueued again; its stage records make the new run resume where the old one stopped. A job
past its deadline ends TIMED_OUT instead, with its final event. The sweep runs this.

A job whose failed stage waits for its retry (StageRecord.next_attempt_at) is alive until that
retry is due, and RECOVER_AFTER more: its task waits in the broker with a countdown.

A job that waits in a long queue also shows no sign of life: it gets a second message, which
is harmless (the second run finds the job finished, or its lease held) but wasted, so keep
RECOVER_AFTER above your queue's usual wait.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models import Max, Q
from django.utils import timezone
from redis.exceptions import RedisError

from eventbus.bus.keys import JobKeys
from eventbus.conf import eventbus_settings
from eventbus.job import lifecycle
from eventbus.job.runs import time_out
from eventbus.redis.clients import get_redis
from eventbus.tasks import enqueue

logger = logging.getLogger(__name__)


def stranded(*, quiet_since, limit: int):
    """Unfinished jobs enqueued at least once whose last sign of life is older than `quiet_since`."""
    from eventbus.models import Job

    return (
        Job.objects.filter(
            # A WAITING job is stranded only once its run was sent (it was woken) and lost: until
            # then the sweeper wakes it (enqueue_due), or a signal or a child does.
            state__in=Job.UNFINISHED_STATES,
            enqueued_at__isnull=False,
        )
        .annotate(
            started=Max("stage_records__started_at"),
            finished=Max("stage_records__finished_at"),
            retry_due=Max("stage_records__next_attempt_at"),
        )
        .filter(enqueued_at__lte=quiet_since)
        .filter(Q(started__isnull=True) | Q(started__lte=quiet_since))
        .filter(Q(finished__isnull=True) | Q(finished__lte=quiet_since))
        # A stage's retry waiting in the broker (its countdown) is not a lost run until it is due.
        .filter(Q(retry_due__isnull=True) | Q(retry_due__lte=quiet_since))
        .order_by("accepted_at")[:limit]
    )


def recover_stranded(*, limit: int = 1000) -> int:
    """Enqueue again (or time out) every stranded job; returns how many were recovered."""
    quiet_since = timezone.now() - timedelta(seconds=eventbus_settings.RECOVER_AFTER)
    client = get_redis()
    recovered = 0
    for job in stranded(quiet_since=quiet_since, limit=limit):
        if lifecycle.past_deadline(job):
            time_out(job)
            recovered += 1
            continue
        try:
            if client.exists(JobKeys(job.domain, str(job.id)).run_lease):
                continue  # a live run holds it: a stage that reports rarely, not a lost run
        except RedisError:
            logger.warning("Recovery: Redis unreachable; trying again next pass", exc_info=True)
            break
        logger.warning(
            "Job %s (%s) shows no sign of life since %s: enqueued again",
            job.id,
            job.state,
            quiet_since.isoformat(),
        )
        if not enqueue(job, again=True):
            break  # the broker is down: the next pass tries again
        recovered += 1
    return recovered
