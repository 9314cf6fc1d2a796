"""Per-user limits on jobs: the cap on running jobs (EVENTBUS["MAX_RUNNING_JOBS_PER_USER"]).

The count and the acceptance are not one atomic step: requests of one user that race may
together pass the cap by a few jobs. It bounds what one user can queue, not an exact budget.
"""

from __future__ import annotations

from .conf import eventbus_settings
from .exceptions import JobLimitReached
from .models import Job


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
