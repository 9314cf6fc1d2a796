"""Runs: run an accepted Job once (the service behind the run_job task, eventbus.tasks).

Delivery is at least once (acks_late, reject_on_worker_lost, the sweep), so a job's task can
arrive twice or run again after a crash. The run is made safe to repeat three ways:

- a job already COMPLETED, FAILED, TIMED_OUT or CANCELLED is never run again;
- a run lease lets one run at a time work on a job: a Redis lock with a token of its own,
  renewed after every event, released at the end. A second run that finds the lease held
  raises JobBusy and the task retries once the lease could have expired;
- a run skips the stages an earlier run finished (their results and events are recorded:
  eventbus.job.stages), republishes their events, which L1 drops, and runs the rest, so the stream
  holds each (stage, seq) of the job once and a finished stage's work never runs again.

A stage's failed attempt that its Stage policy retries ends the run with StageRetry: the lease
is released and the task is sent again with the backoff as its countdown (eventbus.tasks), so
a waiting retry holds no worker. A cancelled job's run stops before its next stage (or where
the running stage reports) and ends it CANCELLED.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from contextlib import contextmanager

import redis
from django.db import InterfaceError, OperationalError
from redis.exceptions import LockError

from eventbus import jobtypes
from eventbus.bus.keys import JobKeys
from eventbus.conf import eventbus_settings
from eventbus.job import cancellation, lifecycle, stagerecords
from eventbus.job.stages import (
    DeadlinePassed,
    RunTakenOver,
    StageRetry,
    failure_of,
    publish_final,
    run_stages,
)
from eventbus.job.waits import StageWaiting
from eventbus.jobtypes import JobCancelled, JobFailed, JobType, UnknownJobType
from eventbus.models import Job
from eventbus.redis.clients import get_redis
from exactly_once.tracing import TRACING, extract, failed, span

logger = logging.getLogger(__name__)

State = Job.State

# Worth another attempt later rather than failing the job: Redis or the database went away.
TRANSIENT_ERRORS = (redis.ConnectionError, redis.TimeoutError, OperationalError, InterfaceError)
MAX_TRANSIENT_RETRIES = 5


class JobBusy(Exception):
    """Another run holds the job's lease; try again in `retry_in` seconds."""

    def __init__(self, job_id: str, retry_in: float):
        super().__init__(f"Job {job_id} is being run by another task; retry in {retry_in:.1f}s")
        self.retry_in = retry_in


class RunLeaseLost(RunTakenOver):
    """The run's lease expired and another run took the job over."""


class RunLease:
    """One run of a job at a time: SET NX PX with a token per run (redis-py's Lock), on the
    job's `run-lease` key (eventbus.bus.keys).

    The lease only has to outlive the work between two renewals (after every event, and every
    third of its length while a stage runs: kept_alive), so it is short: a run whose worker died
    holds the job for at most `seconds` more, EVENTBUS["RUN_LEASE_SECONDS"].
    """

    def __init__(self, job: Job, *, client=None):
        self.client = client or get_redis()
        self.seconds = float(eventbus_settings.RUN_LEASE_SECONDS)
        self.key = JobKeys(job.domain, str(job.id)).run_lease
        self.lock = self.client.lock(self.key, timeout=self.seconds, blocking=False, thread_local=False)

    def acquire(self) -> bool:
        return bool(self.lock.acquire(token=uuid.uuid4().hex))

    def renew(self) -> None:
        try:
            self.lock.extend(self.seconds, replace_ttl=True)
        except LockError as exc:
            raise RunLeaseLost(f"Lease {self.key} was lost: {exc}") from exc

    def release(self) -> None:
        try:
            self.lock.release()
        except LockError:
            pass  # expired, or taken over: it is not ours to release
        except redis.RedisError:
            logger.warning("Could not release %s; it expires in %ss", self.key, self.seconds, exc_info=True)

    @contextmanager
    def kept_alive(self):
        """Renew the lease every third of its length while the block runs: a stage of a user's
        job may run far longer than the lease between two of its events."""
        stop = threading.Event()

        def keep() -> None:
            while not stop.wait(self.seconds / 3):
                try:
                    self.lock.extend(self.seconds, replace_ttl=True)
                except LockError:
                    return  # lost: the run finds out at its next renew()
                except redis.RedisError:
                    logger.warning("Could not renew %s; trying again", self.key, exc_info=True)

        keeper = threading.Thread(target=keep, name=f"run-lease {self.key}", daemon=True)
        keeper.start()
        try:
            yield
        finally:
            stop.set()

    def retry_in(self) -> float:
        """Seconds until the lease expires, unless renewed (a little more, never 0)."""
        return max(self.client.pttl(self.key), 0) / 1000 + 0.2


def run(job_id: str, *, fail_on_transient: bool = True, send: Callable[[Job], object] | None = None) -> str:
    """Run the job to its end, or until a stage waits; returns the outcome ("COMPLETED",
    "FAILED", "TIMED_OUT", "CANCELLED", "waiting", "skipped", "missing" or "lease_lost").
    `send` sends a job's run (a child's, a job woken as it went WAITING: eventbus.tasks.enqueue);
    None: the sweeper sends them.

    Raises JobBusy while another run holds the job, StageRetry when a stage's retry waits, and
    one of TRANSIENT_ERRORS when Redis or the database failed and `fail_on_transient` is false
    (the task retries; on its last attempt the job fails instead).
    """
    job = lifecycle.get(job_id)
    if job is None:
        logger.warning("Job %s: no such job, nothing to run", job_id)
        return "missing"
    if not TRACING:
        return _run(job, fail_on_transient, send)
    # In the trace of the span that accepted the job (its request's): another run holding the
    # job, or a stage's retry that waits, is no failure of this one.
    with span(
        "eventbus.run",
        extract(job.trace_context),
        expected=(JobBusy, StageRetry),
        job_id=str(job.pk),
        domain=job.domain,
    ) as traced:
        outcome = _run(job, fail_on_transient, send)
        traced.set_attribute("outcome", str(outcome))
        if outcome in (State.FAILED, State.TIMED_OUT):
            failed(traced, f"the job ended {outcome}")
        return outcome


def _run(job: Job, fail_on_transient: bool, send: Callable[[Job], object] | None) -> str:
    job_id = str(job.pk)
    if job.ended:
        logger.info("Job %s is %s already; not run again", job_id, job.state)
        return "skipped"
    try:
        job_type = jobtypes.job_type(job.domain)()
        lease = RunLease(job)
    except UnknownJobType as exc:
        logger.error("Job %s failed: %s", job_id, exc)
        return _conclude(job, None, State.FAILED, error=failure_of(exc))
    if not lease.acquire():
        raise JobBusy(job_id, lease.retry_in())
    try:
        was, started_before = job.state, job.started_at
        # Started before anything is published: a job cancelled before it started (PENDING ->
        # CANCELLED, by cancel_job) is never run, and once RUNNING only its run ends it. It
        # reads the state again, with the lease held: its previous holder may have ended it.
        if not lifecycle.start(job):
            return "skipped"
        if lifecycle.past_deadline(job):
            return _conclude(job, job_type, State.TIMED_OUT)
        logger.info("Job %s running (%s, was %s)", job_id, job.domain, was)
        # This run took the job from PENDING (start() set started_at, with the lease held): no
        # run wrote a stage record before it, and a job that retries none has no copied ones.
        first = started_before is None and job.started_at is not None and job.retry_of_id is None
        return _run_stages(job, job_type, lease, send, first=first)
    except StageWaiting as waiting:
        return _wait(job, job_type, waiting, send)
    except DeadlinePassed:
        return _conclude(job, job_type, State.TIMED_OUT)
    except JobCancelled as cancelled:
        logger.info("Job %s: %s", job_id, cancelled)
        return _conclude(job, job_type, State.CANCELLED)
    except StageRetry:
        raise
    except JobFailed as failure:
        logger.warning("Job %s failed: %s", job_id, failure.reason)
        return _conclude(job, job_type, State.FAILED, **failure.data, error=failure_of(failure))
    except RunTakenOver as exc:
        logger.warning("Job %s: %s; its new run finishes it", job_id, exc)
        return "lease_lost"
    except TRANSIENT_ERRORS as exc:
        if not fail_on_transient:
            logger.warning("Job %s interrupted (%s: %s); it will be retried", job_id, type(exc).__name__, exc)
            raise
        logger.exception("Job %s failed: %s, retries exhausted", job_id, type(exc).__name__)
        return _conclude(job, job_type, State.FAILED, error=failure_of(exc))
    except Exception as exc:
        logger.exception("Job %s failed: %s: %s", job_id, type(exc).__name__, exc)
        return _conclude(job, job_type, State.FAILED, error=failure_of(exc))
    finally:
        lease.release()


def _wait(job: Job, job_type: JobType, waiting: StageWaiting, send) -> str:
    """A stage waits: the job goes WAITING and the run ends, holding no worker. What it waits for
    may have come just before (a signal, a child's end: they wake only a WAITING job), so it is
    asked once more now that the job is WAITING."""
    if not lifecycle.wait(job, until=waiting.until):
        if lifecycle.ended_now(job):
            return "skipped"
        logger.info("Job %s: cancelled as stage %s went to wait", job.id, waiting.stage)
        return _conclude(job, job_type, State.CANCELLED)
    if waiting.ready is not None and waiting.ready() and lifecycle.wake(job.pk) and send is not None:
        send(job)
    return "waiting"


def _run_stages(job: Job, job_type: JobType, lease: RunLease, send=None, *, first: bool = False) -> str:
    def after_event() -> None:
        lease.renew()
        if lifecycle.past_deadline(job):
            raise DeadlinePassed()

    with lease.kept_alive():  # a stage may run longer than the lease between two events
        results = run_stages(
            job,
            job_type,
            after_event=after_event,
            is_cancelled=lambda: cancellation.requested(job),
            root_id=lifecycle.chain_root_id(job),
            send=send,
            first=first,
        )
        outcome = job_type.outcome(results) or {}
        publish_final(job, job_type, State.COMPLETED, **outcome)
    # The final event is out; only the database is left to tell.
    return _record_end(job, State.COMPLETED)


def time_out(job: Job) -> str:
    """End a job past its deadline (the recovery's word for a job no run will finish)."""
    try:
        job_type = jobtypes.job_type(job.domain)()
    except UnknownJobType:
        job_type = None
    # PENDING -> RUNNING first: a cancel_job at this moment then only asks (it publishes the
    # final event of a PENDING job itself), so the job's one final event is this one.
    if not lifecycle.start(job):
        return "skipped"
    return _conclude(job, job_type, State.TIMED_OUT)


def _conclude(job: Job, job_type: JobType | None, state: str, **data) -> str:
    """End a job that did not complete: its final event (best effort; none when its type is
    unknown, as its seqs are), then its state."""
    try:
        if job_type is not None:
            publish_final(job, job_type, state, **data)
    except Exception as exc:
        logger.warning("Job %s: could not publish its final %s event: %r", job.id, state, exc)
    return _record_end(job, state)


def _record_end(job: Job, state: str) -> str:
    if lifecycle.end(job, state) and state != State.COMPLETED:
        # A retry or a wait that waited will not come: the stage is no longer RETRYING or WAITING.
        stagerecords.cancel_retry_waits(job, cancelled=state == State.CANCELLED)
    return state
