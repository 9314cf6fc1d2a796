"""Celery tasks of the event bus. Thin: the work is in eventbus.jobs."""
from celery import shared_task

from . import jobs


@shared_task(
    bind=True,
    name="eventbus.run_job",
    # Acknowledged after the run, and requeued if the worker process dies mid-run: a job is
    # never lost with its worker. A second delivery is harmless (see eventbus.jobs).
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    # Waiting for another run's lease is not a failure: no cap (the lease always expires).
    # Redis or database failures are capped by `failures` instead.
    max_retries=None,
)
def run_job(self, job_id: str, failures: int = 0) -> str:
    final_attempt = failures >= jobs.MAX_TRANSIENT_RETRIES
    try:
        return jobs.run(job_id, fail_on_transient=final_attempt)
    except jobs.JobBusy as busy:
        raise self.retry(countdown=busy.retry_in)
    except jobs.TRANSIENT_ERRORS as exc:
        if final_attempt:
            raise
        raise self.retry(exc=exc, countdown=min(2**failures, 30), kwargs={"failures": failures + 1})
