"""A job's life cycle: every change of an Operation's state after its acceptance is made here.

    accepted (idempotency.services.accept) -> PENDING
    enqueued                               -> enqueued_at set (the run_job task reached the broker)
    a run starts                           -> RUNNING
    cancelled before it started            -> CANCELLED (eventbus.services.cancel_job)
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
from django.db.models import Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from idempotency.models import Operation

from . import metrics

logger = logging.getLogger(__name__)

State = Operation.State
FINAL_STATES = (State.COMPLETED, State.FAILED, State.TIMED_OUT, State.CANCELLED)
# What retry_job takes: the jobs that did not complete.
RETRYABLE_STATES = (State.FAILED, State.TIMED_OUT, State.CANCELLED)


def get(job_id: str) -> Operation | None:
    return Operation.objects.filter(pk=job_id).first()


def is_final(operation: Operation) -> bool:
    return operation.state in FINAL_STATES


def refresh_state(operation: Operation) -> str:
    operation.refresh_from_db(fields=["state"])
    return operation.state


def start(operation: Operation) -> bool:
    """PENDING -> RUNNING (a re-run finds it RUNNING already); False when the job has ended
    meanwhile (cancelled before it started)."""
    if Operation.objects.filter(pk=operation.pk, state=State.PENDING).update(state=State.RUNNING):
        operation.state = State.RUNNING
        _count(metrics.job_started, operation.domain, operation.accepted_at, timezone.now())
        return True
    return not is_final_now(operation)


def is_final_now(operation: Operation) -> bool:
    refresh_state(operation)
    return is_final(operation)


def cancel_pending(operation: Operation) -> bool:
    """PENDING -> CANCELLED, when no run started it; False otherwise."""
    now = timezone.now()
    cancelled = Operation.objects.filter(pk=operation.pk, state=State.PENDING).update(
        state=State.CANCELLED, cancel_requested_at=now, completed_at=now
    )
    if cancelled:
        operation.state, operation.cancel_requested_at, operation.completed_at = State.CANCELLED, now, now
        _count(metrics.job_ended, operation.domain, State.CANCELLED, operation.accepted_at, now)
        logger.info("Job %s CANCELLED before it started", operation.op_id)
    return bool(cancelled)


def request_cancel(operation: Operation) -> bool:
    """Ask a RUNNING job's run to stop (the first request's time is kept); False when it is not
    RUNNING."""
    now = timezone.now()
    requested = Operation.objects.filter(pk=operation.pk, state=State.RUNNING).update(
        cancel_requested_at=Coalesce("cancel_requested_at", Value(now))
    )
    if requested:
        operation.refresh_from_db(fields=["state", "cancel_requested_at"])
    return bool(requested)


def chain_root_id(operation: Operation) -> str:
    """The first job of the job's retry chain (itself when it retries none): its id makes
    the stages' keys (StageContext.key)."""
    root_id, retry_of = operation.op_id, operation.retry_of_id
    seen = {root_id}
    while retry_of is not None and retry_of not in seen:
        seen.add(retry_of)
        root_id = retry_of
        retry_of = Operation.objects.filter(pk=retry_of).values_list("retry_of_id", flat=True).first()
    return str(root_id)


def end(operation: Operation, state: str) -> bool:
    """PENDING or RUNNING -> a final state; False when it had ended already."""
    assert state in FINAL_STATES, state
    now = timezone.now()
    ended = Operation.objects.filter(pk=operation.pk, state__in=(State.PENDING, State.RUNNING)).update(
        state=state, completed_at=now
    )
    if ended:
        _count(metrics.job_ended, operation.domain, state, operation.accepted_at, now)
        logger.info("Job %s %s", operation.op_id, state)
    return bool(ended)


def _count(observe, *args) -> None:
    """Count a change once it is committed (a rolled-back change did not happen)."""
    transaction.on_commit(lambda: observe(*args))


def past_deadline(operation: Operation) -> bool:
    if operation.deadline is not None and timezone.now() > operation.deadline:
        logger.warning("Job %s passed its deadline %s", operation.op_id, operation.deadline.isoformat())
        return True
    return False


def mark_enqueued(operation: Operation, *, again: bool = False) -> None:
    """Record that the job's task reached the broker (the sweep leaves it alone from now);
    `again`: a new message for a lost run, which the recovery then waits on."""
    now = timezone.now()
    unsent = {} if again else {"enqueued_at__isnull": True}
    try:
        Operation.objects.filter(pk=operation.pk, **unsent).update(enqueued_at=now)
    except DatabaseError:
        logger.warning(
            "Job %s enqueued, but enqueued_at not recorded; the sweep may send it again", operation.op_id
        )
    operation.enqueued_at = now


def never_enqueued(*, accepted_before: datetime, limit: int):
    """PENDING operations whose task never reached the broker, oldest first (a selector)."""
    return Operation.objects.filter(
        state=State.PENDING, enqueued_at__isnull=True, accepted_at__lte=accepted_before
    ).order_by("accepted_at")[:limit]
