"""Accepting a job once per (scope, key): what start_job (eventbus.services) and a stage's
ctx.start_child (eventbus.job.waits) share. The caller says how the run is sent once the
accepting transaction commits (`on_accepted`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.utils import timezone

from eventbus import jobtypes
from eventbus.exceptions import JobLimitReached
from eventbus.job.limits import check_creation_cap, check_payload_size, check_running_cap
from eventbus.jobtypes import InvalidPayload, JobType, UnknownJobType
from eventbus.models import Job
from exactly_once.tracing import inject
from idempotency.keys import IdemKey
from idempotency.scope import join_scope
from idempotency.services import accept_once

# Where jobs started or retried by code keep their keys when they have no owner (the text is
# stored with each such job: it stays as it was when eventbus.jobs became eventbus.job.runs).
OWNERLESS_SCOPE = join_scope("fn", "eventbus.jobs")
# What must be the same for one key to give one job (else IdempotencyKeyMismatch).
SAME_REQUEST = ("domain", "event_type", "payload", "retry_of")


def owner_scope(owner) -> str:
    """The scope of the owner's keys, as the default resolver gives it to their requests."""
    if owner is None:
        return OWNERLESS_SCOPE
    return join_scope("-", str(owner.pk))


def accept(
    job_type: str | type[JobType],
    payload: dict,
    *,
    key: str | IdemKey,
    owner,
    scope: str | None,
    deadline: datetime | timedelta | None,
    run_after: datetime | timedelta | None,
    queue: str,
    priority: int,
    on_accepted: Callable[[Job], None],
    parent: Job | None = None,
) -> tuple[Job, bool]:
    """The job of this (scope, key), accepted if new (see eventbus.services.start_job)."""
    job_class = job_class_of(job_type)
    if owner is not None and getattr(owner, "pk", None) is None:
        raise ValueError(f"start_job() needs a saved owner (a user with a primary key), not {owner!r}")
    if not isinstance(payload, dict):
        raise InvalidPayload("The payload must be a JSON object.")
    cleaned = job_class().clean_payload(dict(payload))
    scope = scope or owner_scope(owner)
    idem_key = as_key(key)
    if isinstance(deadline, timedelta):
        deadline = timezone.now() + deadline
    if isinstance(run_after, timedelta):
        run_after = timezone.now() + run_after
    if not -100 <= priority <= 100 or int(priority) != priority:
        raise ValueError(f"priority must be a whole number from -100 to 100, not {priority!r}")
    job = Job(
        scope=scope,
        idem_key=idem_key.value,
        domain=job_class.name,
        event_type="job.requested",
        payload=cleaned,
        owner=owner,
        deadline=deadline,
        run_after=run_after,
        queue=queue,
        priority=int(priority),
        parent=parent,
        # The span that accepts it (start_job's eventbus.enqueue, a parent's stage): its run joins it.
        trace_context=inject(),
    )
    try:
        check_payload_size(cleaned)
        check_caps(owner)
    except (InvalidPayload, JobLimitReached):
        # A replay gets its job whatever the limits: asked only when a limit refuses, so a
        # first request (the usual case) costs no query for it.
        if not accepted_before(scope, idem_key):
            raise
    return accept_once(job, unique=("scope", "idem_key"), same=SAME_REQUEST, on_accepted=on_accepted)


def job_class_of(value: str | type[JobType]) -> type[JobType]:
    if isinstance(value, type) and issubclass(value, JobType):
        registered = jobtypes.job_type(value.name)  # UnknownJobType unless registered
        if registered is not value:
            raise UnknownJobType(f"{value.__qualname__} is not the registered job type {value.name!r}")
        return value
    return jobtypes.job_type(value)


def as_key(key: str | IdemKey) -> IdemKey:
    return key if isinstance(key, IdemKey) else IdemKey(str(key))


def accepted_before(scope: str, idem_key: IdemKey) -> bool:
    """A job holds the key already: a replay, which gets its job whatever the limits."""
    return Job.objects.filter(scope=scope, idem_key=idem_key.value).exists()


def check_caps(owner) -> None:
    """The owner's caps on running jobs and on jobs started per period (eventbus.job.limits)."""
    if owner is None:
        return
    check_running_cap(owner)
    check_creation_cap(owner)
