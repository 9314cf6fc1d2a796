"""The event bus's Celery side: `enqueue` sends a job's run_job task; the task is thin and
calls eventbus.job.runs."""

import logging
import time
from contextlib import contextmanager

from celery import shared_task
from celery.backends.base import DisabledBackend
from celery.signals import worker_init
from django.db import close_old_connections
from django.utils import timezone

from eventbus.job import lifecycle, runs
from eventbus.job.stages import StageRetry

logger = logging.getLogger(__name__)


@shared_task(
    bind=True,
    name="eventbus.run_job",
    # Acknowledged after the run, and requeued if the worker process dies mid-run: a job is
    # never lost with its worker. A second delivery is harmless (see eventbus.job.runs).
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    # Waiting for another run's lease is not a failure: no cap (the lease always expires).
    # Redis or database failures are capped by `failures` instead.
    max_retries=None,
)
def run_job(self, job_id: str, failures: int = 0) -> str:
    with request_connections(self):
        return _run_job(self, job_id, failures)


@contextmanager
def request_connections(task):
    """The database connections' life around a run as Django gives it around a request:
    closed before and after when broken or older than CONN_MAX_AGE (close_old_connections),
    kept otherwise. Celery's Django fixup closes them around every task unless
    CELERY_DB_REUSE_MAX is set, whatever CONN_MAX_AGE says, so each run connected anew: with
    that setting, these calls are what drops a broken or obsolete connection. Not when run
    eagerly: the caller's connection (a test's transaction) is not ours to close."""
    if task.request.is_eager:
        yield
        return
    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()


def _run_job(self, job_id: str, failures: int) -> str:
    final_attempt = failures >= runs.MAX_TRANSIENT_RETRIES
    try:
        return runs.run(job_id, fail_on_transient=final_attempt, send=enqueue)
    except runs.JobBusy as busy:
        raise _retry(self, busy.retry_in) from busy
    except StageRetry as retry:
        # The stage's backoff as a countdown: the message waits in the broker (or as an ETA in
        # the worker's consumer), not in a pool process, so other jobs run meanwhile.
        raise _retry(self, retry.countdown) from retry
    except runs.TRANSIENT_ERRORS as exc:
        if final_attempt:
            raise
        raise self.retry(exc=exc, countdown=min(2**failures, 30), kwargs={"failures": failures + 1}) from exc


def _retry(task, countdown: float):
    """The task again in `countdown` seconds. Run eagerly (CELERY_TASK_ALWAYS_EAGER), Celery
    runs a retry at once, ignoring the countdown: the wait is then here, or the retry would
    find the wait not over and recurse."""
    if task.request.is_eager:
        time.sleep(countdown)
    return task.retry(countdown=countdown)


def enqueue(job, *, again: bool = False) -> bool:
    """Send the job's run_job task, then record it enqueued (`again`: its run was lost,
    eventbus.job.recovery). True when it was sent.

    Runs after the accepting transaction committed (accept_once(on_accepted=enqueue), eventbus.services), so it never
    raises: the client's 201 stands either way. When the broker is unreachable it gives up
    fast (CELERY_BROKER_TRANSPORT_OPTIONS) and leaves enqueued_at NULL; the sweep
    (eventbus.job.sweep.enqueue_pending) sends the task later. The task id is the job id, so a
    duplicate message of one job is recognisable (and harmless: see eventbus.job.runs).
    """
    job_id = str(job.id)
    sent_at = timezone.now()
    try:
        _without_result_backend(run_job)
        run_job.apply_async(
            (job_id,),
            task_id=job_id,
            retry=False,
            queue=job.queue or None,
            priority=broker_priority(job.priority),
        )
    except Exception:
        logger.warning(
            "Job %s not enqueued (broker unreachable?); the sweep will enqueue it", job_id, exc_info=True
        )
        return False
    lifecycle.mark_enqueued(job, again=again, sent_at=sent_at)
    return True


_no_result_backend: set[str] = set()


def _without_result_backend(task) -> None:
    """Give the task Celery's DisabledBackend as its own result backend, once per process.

    run_job stores no result (ignore_result), yet sending it builds an AsyncResult, which asks
    for the app's result backend; Celery keeps that backend per thread unless it is thread-safe
    (the default, disabled one is not), and builds it in each new thread by scanning every
    installed package's entry points: about 4 ms of CPU. Django's ASGI handler runs each
    request in a new thread, so every keyed POST paid it."""
    if task.name not in _no_result_backend:
        task.backend = DisabledBackend(task.app)
        _no_result_backend.add(task.name)


def broker_priority(priority: int) -> int:
    """A job's priority (-100..100, higher first, as django.tasks numbers it) as the broker's
    (0..9, 0 first: kombu's Redis transport reads its `priority_steps` in that order; by default
    four bands: 0, 3, 6, 9)."""
    return round((100 - max(-100, min(100, priority))) * 9 / 200)


@worker_init.connect(weak=False)
def check_redis_at_start(**kwargs) -> None:
    """A worker publishes the jobs' events: it says so at start when Redis cannot keep them."""
    from eventbus.redis.clients import get_redis
    from eventbus.redis.durability import check_durability

    check_durability(get_redis(), process="celery worker")
