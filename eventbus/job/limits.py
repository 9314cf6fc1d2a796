"""Per-user limits on jobs, each checked by the job services (eventbus.services) for a new job
only, so that code and the jobs API share them and a replay of a key always gets its job:

- the cap on running jobs (EVENTBUS["MAX_RUNNING_JOBS_PER_USER"]);
- the cap on jobs started per period (EVENTBUS["MAX_JOBS_CREATED_PER_USER"] per
  EVENTBUS["JOBS_CREATED_PERIOD"] seconds), retries included. Counted from the jobs' rows, not a
  cache: a user cannot reset it, and cancelling jobs does not get around it as it does the first;
- the size of a payload (EVENTBUS["MAX_PAYLOAD_BYTES"]): every job keeps its payload until it
  is deleted (EVENTBUS["KEEP_ENDED_JOBS"]).

The counts and the acceptance are not one atomic step: requests of one user that race may
together pass a cap by a few jobs. They bound what one user can queue and store, not an exact
budget.
"""

from __future__ import annotations

import json
import math
from datetime import timedelta

from django.utils import timezone

from eventbus.conf import eventbus_settings
from eventbus.exceptions import JobCreationLimitReached, JobLimitReached
from eventbus.jobtypes import InvalidPayload
from eventbus.models import Job


def check_running_cap(owner) -> None:
    """Raise JobLimitReached when `owner` has the cap's number of jobs PENDING or RUNNING.
    No owner (a job started by code for nobody), or no cap (None): no limit."""
    cap = eventbus_settings.MAX_RUNNING_JOBS_PER_USER
    if cap is None or owner is None or owner.pk is None:
        return
    # Counted up to the cap only: a user far over it (the cap lowered) costs no more.
    running = Job.objects.filter(owner=owner, state__in=Job.UNFINISHED_STATES).values("pk")[:cap].count()
    if running >= cap:
        raise JobLimitReached(retry_after=eventbus_settings.MAX_RUNNING_JOBS_RETRY_AFTER)


def check_creation_cap(owner) -> None:
    """Raise JobCreationLimitReached when `owner` has started the cap's number of jobs within
    the period; its retry_after is when the oldest of them leaves the period. No owner, or no
    cap (None): no limit. One query, on the (owner, -accepted_at) index."""
    cap = eventbus_settings.MAX_JOBS_CREATED_PER_USER
    if cap is None or owner is None or owner.pk is None:
        return
    period = timedelta(seconds=eventbus_settings.JOBS_CREATED_PERIOD)
    if cap < 1:  # no job at all
        raise _too_many_started(cap, math.ceil(period.total_seconds()))
    now = timezone.now()
    # The cap-th newest job of the period: while it is in the period, one more is too many.
    capped_at = (
        Job.objects.filter(owner=owner, accepted_at__gt=now - period)
        .order_by("-accepted_at")
        .values_list("accepted_at", flat=True)[cap - 1 : cap]
        .first()
    )
    if capped_at is None:
        return
    raise _too_many_started(cap, math.ceil((capped_at + period - now).total_seconds()))


def _too_many_started(cap: int, retry_after: int) -> JobCreationLimitReached:
    retry_after = max(1, retry_after)
    return JobCreationLimitReached(
        retry_after,
        f"Too many jobs started: at most {cap} per {eventbus_settings.JOBS_CREATED_PERIOD} s; "
        f"retry after {retry_after} s.",
    )


def check_payload_size(payload) -> None:
    """Raise InvalidPayload when the payload's compact JSON (UTF-8) is larger than
    EVENTBUS["MAX_PAYLOAD_BYTES"] (None: no limit)."""
    limit = eventbus_settings.MAX_PAYLOAD_BYTES
    if limit is None:
        return
    # surrogatepass: a lone surrogate ("\ud800", which JSON allows) counts, rather than failing.
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=str)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise InvalidPayload(
            f"The payload is {size} bytes of JSON; the limit is {limit} bytes (EVENTBUS['MAX_PAYLOAD_BYTES'])."
        )
