"""A job's life cycle: every change of a Job's state after its acceptance is made here.

    accepted (eventbus.services)           -> PENDING
    enqueued                               -> enqueued_at set (the run_job task reached the broker)
    a run starts                           -> RUNNING
    a stage waits (sleep, signal, children)-> WAITING (run_after: when it resumes, if known)
    woken (due, signalled, children ended) -> run_after now; its run starts it RUNNING again
    cancelled before it started, or WAITING-> CANCELLED (eventbus.services.cancel_job)
    cancelled while running                -> cancel_requested_at set; its run ends it CANCELLED
    the run ends                           -> COMPLETED | FAILED | TIMED_OUT | CANCELLED (final: never left)

Each change is a compare-and-set on the state it leaves, so two runs of one job (a task
delivered twice) cannot move it backwards or end it twice; the job metrics (eventbus.metrics)
are counted here, where a change is known to have happened once.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import DatabaseError, transaction
from django.db.models import Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from eventbus import metrics
from eventbus.models import Job

logger = logging.getLogger(__name__)

State = Job.State


def get(job_id: str) -> Job | None:
    return Job.objects.filter(pk=job_id).first()


def refresh_state(job: Job) -> str:
    job.refresh_from_db(fields=["state"])
    return job.state


def start(job: Job) -> bool:
    """PENDING or WAITING -> RUNNING (a re-run finds it RUNNING already); False when the job has
    ended meanwhile (cancelled before it started, or while it waited)."""
    now = timezone.now()
    if Job.objects.filter(pk=job.pk, state=State.PENDING).update(state=State.RUNNING, started_at=now):
        job.state, job.started_at = State.RUNNING, now
        _count(metrics.job_started, job.domain, job.accepted_at, now)
        return True
    # Not PENDING: a re-run (RUNNING), a resumption (WAITING), or it ended. Read once, as a
    # re-run always did; a resumption writes once more.
    refresh_state(job)
    if job.state == State.WAITING and Job.objects.filter(pk=job.pk, state=State.WAITING).update(
        state=State.RUNNING
    ):
        job.state = State.RUNNING
        return True
    return not job.ended


def wait(job: Job, *, until: datetime | None) -> bool:
    """RUNNING -> WAITING: a stage waits, its run ends and holds no worker; the run is sent again
    `until` (the sweeper, eventbus.job.sweep.enqueue_due), or when woken (wake()). False when the
    job was cancelled meanwhile (the run then ends it CANCELLED) or is not RUNNING."""
    waiting = Job.objects.filter(pk=job.pk, state=State.RUNNING, cancel_requested_at__isnull=True).update(
        state=State.WAITING, run_after=until, enqueued_at=None
    )
    if waiting:
        job.state, job.run_after, job.enqueued_at = State.WAITING, until, None
        logger.info("Job %s WAITING%s", job.id, f" until {until.isoformat()}" if until else "")
    return bool(waiting)


def wake(job_id) -> bool:
    """A WAITING job's wait is over (its signal came, its children ended): due now, its run not
    sent (the caller sends it, or the sweeper does). False when it is not WAITING."""
    return bool(
        Job.objects.filter(pk=job_id, state=State.WAITING).update(run_after=timezone.now(), enqueued_at=None)
    )


def ended_now(job: Job) -> bool:
    """Whether the job has ended (Job.ended), its state read again first."""
    refresh_state(job)
    return job.ended


def cancel_pending(job: Job) -> bool:
    """PENDING or WAITING -> CANCELLED, when no run holds it; False otherwise."""
    now = timezone.now()
    cancelled = Job.objects.filter(pk=job.pk, state__in=Job.STARTABLE_STATES).update(
        state=State.CANCELLED, cancel_requested_at=now, completed_at=now
    )
    if cancelled:
        job.state, job.cancel_requested_at, job.completed_at = State.CANCELLED, now, now
        _count(metrics.job_ended, job.domain, State.CANCELLED, job.accepted_at, now)
        logger.info("Job %s CANCELLED while no run held it", job.id)
        if job.parent_id is not None:
            parent_id = job.parent_id
            transaction.on_commit(lambda: wake_parent(parent_id))
    return bool(cancelled)


def request_cancel(job: Job) -> bool:
    """Ask a RUNNING job's run to stop (the first request's time is kept); False when it is not
    RUNNING."""
    now = timezone.now()
    requested = Job.objects.filter(pk=job.pk, state=State.RUNNING).update(
        cancel_requested_at=Coalesce("cancel_requested_at", Value(now))
    )
    if requested:
        job.refresh_from_db(fields=["state", "cancel_requested_at"])
    return bool(requested)


def chain_root_id(job: Job) -> str:
    """The first job of the job's retry chain (itself when it retries none): its id makes
    the stages' keys (StageContext.key)."""
    root_id, retry_of = job.id, job.retry_of_id
    seen = {root_id}
    while retry_of is not None and retry_of not in seen:
        seen.add(retry_of)
        root_id = retry_of
        retry_of = Job.objects.filter(pk=retry_of).values_list("retry_of_id", flat=True).first()
    return str(root_id)


def end(job: Job, state: str) -> bool:
    """PENDING or RUNNING -> a final state; False when it had ended already."""
    assert state in Job.FINAL_STATES, state
    now = timezone.now()
    ended = Job.objects.filter(pk=job.pk, state__in=Job.UNFINISHED_STATES).update(
        state=state, completed_at=now
    )
    if ended:
        _count(metrics.job_ended, job.domain, state, job.accepted_at, now)
        logger.info("Job %s %s", job.id, state)
        if job.parent_id is not None:
            parent_id = job.parent_id
            transaction.on_commit(lambda: wake_parent(parent_id))
    return bool(ended)


def wake_parent(parent_id) -> bool:
    """Wake a parent whose stage waits for its children (ctx.wait_children) once none of them is
    unfinished; the sweeper sends its run (EVENTBUS["DELAYED_START_POLL"]). Each child's end asks:
    the last one to commit finds them all ended."""
    from eventbus.models import StageRecord

    if Job.objects.filter(parent_id=parent_id, state__in=Job.UNFINISHED_STATES).exists():
        return False
    if not StageRecord.objects.filter(job_id=parent_id, waiting_for="children").exists():
        return False
    return wake(parent_id)


def _count(observe, *args) -> None:
    """Count a change once it is committed (a rolled-back change did not happen)."""
    transaction.on_commit(lambda: observe(*args))


def past_deadline(job: Job) -> bool:
    if job.deadline is not None and timezone.now() > job.deadline:
        logger.warning("Job %s passed its deadline %s", job.id, job.deadline.isoformat())
        return True
    return False


def mark_enqueued(job: Job, *, again: bool = False, sent_at: datetime | None = None) -> None:
    """Record that the job's task reached the broker (the sweep leaves it alone from now);
    `again`: a new message for a lost run, which the recovery then waits on. `sent_at`: when it
    was sent; a run quick enough to have put the job WAITING since (a sleep due later) is not
    marked, or the sweeper would never send its resumption."""
    now = timezone.now()
    unsent = {} if again else {"enqueued_at__isnull": True}
    try:
        Job.objects.filter(pk=job.pk, **unsent).exclude(
            state=State.WAITING, run_after__gt=sent_at or now
        ).update(enqueued_at=now)
    except DatabaseError:
        logger.warning("Job %s enqueued, but enqueued_at not recorded; the sweep may send it again", job.id)
    job.enqueued_at = now


def never_enqueued(*, accepted_before: datetime, limit: int):
    """PENDING jobs whose task never reached the broker, oldest first (a selector); a delayed
    start (run_after) only once it is due."""
    return (
        Job.objects.filter(state=State.PENDING, enqueued_at__isnull=True, accepted_at__lte=accepted_before)
        .filter(Q(run_after__isnull=True) | Q(run_after__lte=timezone.now()))
        .order_by("accepted_at")[:limit]
    )


def due_delayed(*, limit: int):
    """PENDING or WAITING jobs whose delayed start or resumption (run_after) is due and whose run
    was not sent yet, the most overdue first, then the highest priority (a selector; the index
    job_delayed_start)."""
    return Job.objects.filter(
        state__in=Job.STARTABLE_STATES,
        enqueued_at__isnull=True,
        run_after__isnull=False,
        run_after__lte=timezone.now(),
    ).order_by("run_after", "-priority")[:limit]


def waiting_past_deadline(*, limit: int):
    """WAITING jobs past their deadline with no run sent (a selector): the sweeper sends their
    run, which ends them TIMED_OUT."""
    return Job.objects.filter(
        state=State.WAITING, enqueued_at__isnull=True, deadline__isnull=False, deadline__lte=timezone.now()
    )[:limit]
