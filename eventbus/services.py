"""The job services a project calls: start a job, cancel it, retry one that did not complete.

    job, created = start_job("refund", {"order": 42}, key="refund-42", owner=request.user)
    cancel_job(job.id)                      # PENDING: CANCELLED now; RUNNING: its run stops
    new, created = retry_job(job.id, key="retry-1")   # a FAILED/TIMED_OUT/CANCELLED job
    new, created = retry_as_operator(job)             # the admin's action, retry_jobs
    signal_job(job.id, "approve", {"by": "ann"}, key="approve-1")   # a stage's ctx.wait_for("approve")

start_job and retry_job are once per (scope, key), the scope being the owner's as the jobs API
resolves it with the default resolver (`-:<pk>`), so a job started by code and one POSTed
under the same key are one job. Both accept the job with idempotency's accept-once (one INSERT
... ON CONFLICT DO NOTHING on the UNIQUE (scope, idem_key)) and enqueue its run after the
transaction commits. A new job (not a replay of its key) must pass the owner's limits first
(eventbus.job.limits: the payload's size, the running jobs, the jobs started per period); a job has
at most one retry (the UNIQUE Job.retry_of).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.utils import timezone

from eventbus import jobtypes, metrics
from eventbus.exceptions import JobAlreadyRetried, JobEnded, JobNotRetryable, SignalAlreadySent, UnknownSignal
from eventbus.job import accepting, cancellation, lifecycle, stagerecords
from eventbus.job.accepting import (  # OWNERLESS_SCOPE, owner_scope: importable from here, as before
    OWNERLESS_SCOPE,  # noqa: F401
    SAME_REQUEST,
    accepted_before,
    as_key,
    check_caps,
    owner_scope,
)
from eventbus.job.limits import check_payload_size
from eventbus.jobtypes import InvalidPayload, JobType
from eventbus.models import Job, JobSignal
from eventbus.selectors import retry_id
from exactly_once.jsontext import json_unstorable
from exactly_once.tracing import inject, span
from idempotency.exceptions import IdempotencyKeyMismatch
from idempotency.keys import IdemKey
from idempotency.scope import join_scope
from idempotency.services import accept_once

logger = logging.getLogger(__name__)

State = Job.State
# Where the operator's bulk retries (the admin's action, the retry_jobs command) keep their keys:
# three parts, where a request's scope joins two (a tenant and a principal, idempotency.scope),
# so that no user's request can take such a key first and block the retry.
OPERATOR_SCOPE = join_scope("op", "eventbus", "retry")


def start_job(
    job_type: str | type[JobType],
    payload: dict,
    *,
    key: str | IdemKey,
    owner,
    scope: str | None = None,
    deadline: datetime | timedelta | None = None,
    run_after: datetime | timedelta | None = None,
    queue: str = "",
    priority: int = 0,
) -> tuple[Job, bool]:
    """The job of this (scope, key), started if new.

    The run is enqueued once the transaction commits, or once `run_after` is due.

    Parameters
    ----------
    job_type : str or JobType subclass
        The job's type, by its name or its class.
    payload : dict
        The job's input; it goes through its type's clean_payload.
    key : str or IdemKey
        The job's idempotency key: once per (scope, key).
    owner : User
        Who owns the job.
    scope : str, optional
        The key's scope; by default the owner's, as the jobs API resolves it (`-:<pk>`).
    deadline : datetime or timedelta, optional
        When the job times out: a datetime, or a timedelta from now.
    run_after : datetime or timedelta, optional
        A delayed start: the job stays PENDING, its run unsent, until then (a datetime, or a
        timedelta from now). Kept with the job, it survives restarts of every process and of
        Redis; the sweeper (`sweep_jobs`) sends the run once it is due.
    queue : str, optional
        The Celery queue its run is sent to; by default the Celery app's default queue.
    priority : int, optional
        -100 to 100, higher first among the ready runs of its queue (0 by default).

    Returns
    -------
    tuple of (Job, bool)
        The job, and whether this call created it.

    Raises
    ------
    InvalidPayload
        From the type's clean_payload, or for a new job's payload over
        EVENTBUS["MAX_PAYLOAD_BYTES"].
    IdempotencyKeyMismatch
        For the same key with another type or payload.
    JobLimitReached
        Past the owner's running cap.
    JobCreationLimitReached
        Past the owner's jobs started per period."""
    # The span that accepts the job: the job keeps its trace context (Job.trace_context, set by
    # accepting.accept), and its run joins the trace.
    with span("eventbus.enqueue", domain=getattr(job_type, "name", job_type)) as traced:
        job, created = accepting.accept(
            job_type,
            payload,
            key=key,
            owner=owner,
            scope=scope,
            deadline=deadline,
            run_after=run_after,
            queue=queue,
            priority=priority,
            on_accepted=_enqueue,
        )
        if traced is not None:
            traced.set_attributes({"job_id": str(job.pk), "domain": job.domain, "created": created})
    return job, created


def cancel_job(job_id) -> Job:
    """Cancel the job: PENDING or WAITING ends CANCELLED at once, with its final event; RUNNING
    is asked to stop (its stage sees ctx.cancelled, no later stage starts) and its run ends it
    CANCELLED. Its unfinished children (ctx.start_child) are cancelled with it.

    Each change is a compare-and-set on the state: a job ending as it is cancelled ends in
    one state, with one final event (only its run publishes a running job's).

    Parameters
    ----------
    job_id
        The job's id.

    Returns
    -------
    Job
        The job, as it stands after the cancel.

    Raises
    ------
    JobEnded
        For an ended job.
    Job.DoesNotExist
        For no job."""
    job = Job.objects.get(pk=job_id)
    while True:
        if job.ended:
            raise JobEnded(job)
        if job.state in Job.STARTABLE_STATES:
            if lifecycle.cancel_pending(job):
                stagerecords.cancel_retry_waits(job, cancelled=True)  # a stage that waited
                transaction.on_commit(lambda: _publish_cancelled(job))
                break
        elif lifecycle.request_cancel(job):
            transaction.on_commit(lambda: cancellation.set_flag(job))
            if not _run_is_live(job):
                # Its run waits for a stage's retry, or was lost: a run now ends it, rather than
                # when the retry is due or the recovery finds it.
                transaction.on_commit(lambda: _enqueue(job, again=True))
            break
        lifecycle.refresh_state(job)  # it started, or ended, meanwhile
    for child_id in Job.objects.filter(parent=job, state__in=Job.UNFINISHED_STATES).values_list(
        "pk", flat=True
    ):
        try:
            cancel_job(child_id)
        except JobEnded:
            pass  # it ended meanwhile
    return job


def retry_job(job_id, *, key: str | IdemKey, owner=None, scope: str | None = None) -> tuple[Job, bool]:
    """A new job (`retry_of` the old one) that reuses the old job's finished stages and runs
    from the first unfinished one; its stages keep the retry chain's first job's keys. The old
    job is left as it is (its state and its stream).

    Parameters
    ----------
    job_id
        The old job's id.
    key : str or IdemKey
        The retry's idempotency key: once per (scope, key).
    owner : User, optional
        The new job's owner; by default the old job's.
    scope : str, optional
        The key's scope; by default the owner's.

    Returns
    -------
    tuple of (Job, bool)
        The new job, and whether this call created it.

    Raises
    ------
    JobNotRetryable
        Unless the job is FAILED, TIMED_OUT or CANCELLED.
    JobAlreadyRetried
        For a new key when the job has a retry already (a job has one: concurrent retries under
        two keys give one new job and one refusal).
    JobLimitReached, JobCreationLimitReached
        The owner's limits, as start_job."""
    with span("eventbus.enqueue", retry_of=str(job_id)) as traced:
        job, created = _retry_job(job_id, key=key, owner=owner, scope=scope)
        if traced is not None:
            traced.set_attributes({"job_id": str(job.pk), "domain": job.domain, "created": created})
    return job, created


def _retry_job(job_id, *, key: str | IdemKey, owner, scope: str | None) -> tuple[Job, bool]:
    old = Job.objects.get(pk=job_id)
    if old.state not in Job.RETRYABLE_STATES:
        raise JobNotRetryable(old)
    owner = owner if owner is not None else old.owner
    scope = scope or owner_scope(owner)
    idem_key = as_key(key)
    deadline = None
    if old.deadline is not None:  # the same time to run as the old job had
        deadline = timezone.now() + (old.deadline - old.accepted_at)
    new = Job(
        scope=scope,
        idem_key=idem_key.value,
        domain=old.domain,
        event_type="job.retried",
        payload=old.payload,
        owner=owner,
        deadline=deadline,
        retry_of=old,
        queue=old.queue,
        priority=old.priority,
        trace_context=inject(),
    )
    if not accepted_before(scope, idem_key):
        retried_by = retry_id(old)
        if retried_by is not None:
            raise JobAlreadyRetried(old, retried_by)
        check_caps(owner)
    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint: a concurrent retry's row refuses this one
                job, created = accept_once(
                    new, unique=("scope", "idem_key"), same=SAME_REQUEST, on_accepted=_enqueue
                )
        except IntegrityError:
            retried_by = retry_id(old)  # the UNIQUE retry_of: another key's retry won the race
            if retried_by is None:
                raise
            raise JobAlreadyRetried(old, retried_by) from None
        if created:
            stagerecords.copy_finished(old, job)
            logger.info("Job %s retries job %s (%s)", job.id, old.id, old.state)
            transaction.on_commit(lambda: metrics.job_retried(old.domain))
    return job, created


def signal_job(
    job_id, name: str, payload=None, *, key: str | IdemKey, sent_by=None
) -> tuple[JobSignal, bool]:
    """Send the signal `name` to the job: a stage's ctx.wait_for(name) returns `payload`. Kept
    until a stage waits for it (a signal sent early is not lost); a job WAITING for it is woken
    and its run sent once the transaction commits.

    One signal of each name per job: sent again with the same key, it is the same signal (a
    client's retry); with another key, it is refused.

    Parameters
    ----------
    job_id
        The job's id.
    name : str
        The signal's name: one its job type's stages declare (Stage(signals=...)).
    payload : JSON, optional
        What wait_for returns (None: `{}`), at most EVENTBUS["MAX_PAYLOAD_BYTES"].
    key : str or IdemKey
        The signal's idempotency key.
    sent_by : User, optional
        Who sends it (kept with it; None: code).

    Returns
    -------
    tuple of (JobSignal, bool)
        The signal, and whether this call sent it.

    Raises
    ------
    UnknownSignal
        For a name the job's type does not declare.
    SignalAlreadySent
        For a signal of that name sent before under another key.
    IdempotencyKeyMismatch
        For the same key with another payload.
    JobEnded
        For a job that has ended (a new signal could never be taken).
    InvalidPayload
        For a payload that is not JSON a database stores, or too large.
    Job.DoesNotExist
        For no job."""
    job = Job.objects.get(pk=job_id)
    known = jobtypes.job_type(job.domain).signal_names()
    if name not in known:
        raise UnknownSignal(job, name, known)
    payload = {} if payload is None else payload
    text = _signal_payload_text(payload)
    idem_key = as_key(key)
    sent = _sent_signal(job, name, idem_key, payload)
    if sent is not None:
        return sent, False
    if job.ended:
        raise JobEnded(job, "there is nothing to signal")
    check_payload_size(json.loads(text))
    try:
        with transaction.atomic():
            sent = JobSignal.objects.create(
                job=job, name=name, payload=payload, idem_key=idem_key.value, sent_by=sent_by
            )
    except IntegrityError:
        sent = _sent_signal(job, name, idem_key, payload)  # a concurrent send of it won
        if sent is None:
            raise
        return sent, False
    logger.info("Job %s sent the signal %s", job.id, name)
    transaction.on_commit(lambda: _wake(job))
    return sent, True


def _signal_payload_text(payload) -> str:
    try:
        text = json.dumps(payload, cls=DjangoJSONEncoder, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"A signal's payload must be JSON: {exc}") from exc
    if (found := json_unstorable(text)) is not None:
        raise InvalidPayload(f"A signal's payload holds {found}, which not every database stores.")
    return text


def _sent_signal(job: Job, name: str, idem_key: IdemKey, payload) -> JobSignal | None:
    """The signal `name` sent to the job before, if any: the same one for its key (and payload),
    refused for another key."""
    sent = JobSignal.objects.filter(job=job, name=name).first()
    if sent is None:
        return None
    if sent.idem_key != idem_key.value:
        raise SignalAlreadySent(job, name)
    if json.dumps(sent.payload, sort_keys=True, cls=DjangoJSONEncoder) != json.dumps(
        json.loads(json.dumps(payload, cls=DjangoJSONEncoder)), sort_keys=True
    ):
        raise IdempotencyKeyMismatch(f"Key {idem_key} of the signal {name!r} was used with another payload.")
    return sent


def _wake(job: Job) -> None:
    """The job's wait may be over: a WAITING job is due now and its run sent (the sweeper sends
    it otherwise)."""
    if lifecycle.wake(job.pk):
        job.refresh_from_db()
        _enqueue(job)


def retry_key(job: Job) -> str:
    """The key of a bulk retry of the job: retrying it twice gives one new job."""
    return f"retry:{job.id}"


def retry_as_operator(job: Job) -> tuple[Job, bool]:
    """The operator's retry of the job (the admin's action, the retry_jobs command): under
    retry_key in OPERATOR_SCOPE, which no user's request can write; the new job is the old job's
    owner's (it shows in their list). Raises as retry_job does."""
    return retry_job(job.id, key=retry_key(job), scope=OPERATOR_SCOPE)


def _run_is_live(job: Job) -> bool:
    """A run holds the job's lease (when Redis cannot say, assume it does: no extra message)."""
    from redis.exceptions import RedisError

    from eventbus.bus.keys import JobKeys
    from eventbus.redis.clients import get_redis

    try:
        return bool(get_redis().exists(JobKeys(job.domain, str(job.id)).run_lease))
    except RedisError:
        return True


def _enqueue(job: Job, *, again: bool = False) -> None:
    from eventbus.tasks import enqueue  # Celery is imported by the worker's side only when used

    if job.state == State.PENDING and job.run_after is not None and job.run_after > timezone.now():
        return  # a delayed start: the sweeper sends its run once due (eventbus.job.sweep.enqueue_due)
    enqueue(job, again=again)


def _publish_cancelled(job: Job) -> None:
    """The final event of a job cancelled before it started (best effort, as every final
    event of a job that did not complete)."""
    from eventbus.job.stages import publish_final

    try:
        publish_final(job, jobtypes.job_type(job.domain), State.CANCELLED)
    except Exception as exc:
        logger.warning("Job %s: could not publish its final CANCELLED event: %r", job.id, exc)
