"""The sweep: no accepted job stays stranded.

`accept` enqueues a job's task after commit; when the broker was unreachable then, the
Job stays PENDING with enqueued_at NULL, and this sends its task later. So an accepted
job is never lost, even if the broker was down when it was accepted, or the process
crashed between the commit and the enqueue. Each pass also enqueues again the jobs whose run
was lost (eventbus.job.recovery).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.utils import timezone

from eventbus.bus.loop import LoopWorker
from eventbus.conf import eventbus_settings
from eventbus.job import lifecycle
from eventbus.tasks import enqueue

logger = logging.getLogger(__name__)


def enqueue_pending(*, older_than_seconds: float = 30, limit: int = 1000) -> int:
    """Enqueue up to `limit` PENDING jobs never enqueued, accepted more than
    `older_than_seconds` ago (younger ones may still be on their way, after commit).
    Returns how many were enqueued; stops at the first failure (the broker is still down).
    """
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    pending = lifecycle.never_enqueued(accepted_before=cutoff, limit=limit)
    enqueued = 0
    for job in pending:
        if not enqueue(job):
            break
        enqueued += 1
    if enqueued:
        logger.info("Enqueued %d job(s) accepted while the broker was unreachable", enqueued)
    return enqueued


def enqueue_due(*, limit: int = 1000) -> int:
    """Send the run of each job whose delayed start (run_after) is due: the job was kept PENDING,
    its run unsent, until then (never a broker ETA, which a restart of Redis or a long delay can
    lose or run twice). Stops at the first failure (the broker is down: the next pass tries
    again); a run sent twice by two sweepers at once runs once (eventbus.job.runs)."""
    enqueued = 0
    for job in [*lifecycle.due_delayed(limit=limit), *lifecycle.waiting_past_deadline(limit=limit)]:
        if not enqueue(job):
            break
        enqueued += 1
    if enqueued:
        logger.info("Started %d delayed job(s) now due", enqueued)
    return enqueued


def sweep(*, older_than_seconds: float = 30) -> int:
    """One pass: jobs never enqueued, then jobs whose run was lost (eventbus.job.recovery)."""
    from eventbus.job.recovery import recover_stranded

    return enqueue_pending(older_than_seconds=older_than_seconds) + recover_stranded()


class Sweeper(LoopWorker):
    """Runs `sweep` every `interval` seconds until stopped (eventbus.bus.loop's loop): no accepted
    job stays stranded. Between two sweeps it starts the delayed jobs now due (`enqueue_due`)
    every EVENTBUS["DELAYED_START_POLL"] seconds: a job runs that long after its run_after at
    most, while the sweeper runs."""

    name = "sweep_jobs"
    one_pass_burst = True  # --burst: one pass, then exit

    def __init__(self, *, interval: float = 30, older_than_seconds: float = 30, burst: bool = False):
        super().__init__(burst=burst)
        self.interval = interval
        self.pause = min(interval, float(eventbus_settings.DELAYED_START_POLL))
        self.older_than_seconds = older_than_seconds
        self.next_sweep = 0.0

    def setup(self) -> None:
        if not self.burst:
            logger.info(
                "Sweeping every %ss for jobs never enqueued or whose run was lost; delayed starts every %ss",
                self.interval,
                self.pause,
            )

    def work_once(self) -> int:
        done = enqueue_due()
        if time.monotonic() >= self.next_sweep:
            done += sweep(older_than_seconds=self.older_than_seconds)
            self.next_sweep = time.monotonic() + self.interval
        return done
