"""The sweep: no accepted job stays stranded.

`accept` enqueues a job's task after commit; when the broker was unreachable then, the
Operation stays PENDING with enqueued_at NULL, and this sends its task later. So an accepted
operation is never lost, even if the broker was down when it was accepted, or the process
crashed between the commit and the enqueue. Each pass also enqueues again the jobs whose run
was lost (eventbus.recovery).
"""
from __future__ import annotations

import logging
import threading
from datetime import timedelta

from django.utils import timezone

from . import lifecycle
from .stopping import GracefulStop
from .tasks import enqueue

logger = logging.getLogger(__name__)


def enqueue_pending(*, older_than_seconds: float = 30, limit: int = 1000) -> int:
    """Enqueue up to `limit` PENDING operations never enqueued, accepted more than
    `older_than_seconds` ago (younger ones may still be on their way, after commit).
    Returns how many were enqueued; stops at the first failure (the broker is still down).
    """
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    pending = lifecycle.never_enqueued(accepted_before=cutoff, limit=limit)
    enqueued = 0
    for operation in pending:
        if not enqueue(operation):
            break
        enqueued += 1
    if enqueued:
        logger.info("Enqueued %d operation(s) accepted while the broker was unreachable", enqueued)
    return enqueued


def sweep(*, older_than_seconds: float = 30) -> int:
    """One pass: jobs never enqueued, then jobs whose run was lost (eventbus.recovery)."""
    from .recovery import recover_stranded

    return enqueue_pending(older_than_seconds=older_than_seconds) + recover_stranded()


class Sweeper:
    """Runs `sweep` every `interval` seconds until stopped: no accepted job stays stranded.

    SIGTERM or SIGINT stops it after the pass in hand; a second one stops it at once.
    """

    def __init__(self, *, interval: float = 30, older_than_seconds: float = 30):
        self.interval = interval
        self.older_than_seconds = older_than_seconds
        self._stop = threading.Event()

    def run(self, *, burst: bool = False) -> int:
        """Sweep until stopped (or once, with `burst`); returns how many were enqueued."""
        total = 0
        if not burst:
            logger.info("Sweeping every %ss for jobs never enqueued or whose run was lost", self.interval)
        with GracefulStop(self.stop, name="sweep_operations"):
            while True:
                try:
                    total += sweep(older_than_seconds=self.older_than_seconds)
                except Exception:
                    # The database went away: try again next time, never a crash loop.
                    logger.exception("Sweep failed; next try in %ss", self.interval)
                if burst or self._stop.wait(self.interval):
                    return total

    def stop(self) -> None:
        self._stop.set()
