"""Reads of jobs and of the bus's per-job data (HackSoft-style selectors: no writes here).

Whoever reads a job outside the event bus (the gateway's API, its WebSocket stream and the
states it reads again after a Redis blip) reads it here: which jobs a user sees, the list, one
job, its stage records, its latest event, its stages as a timeline, and the job's detail as a
value (job_detail: its fields, latest event, error and stages, which the jobs API shows). The models are imported
where they are read: the gateway's modules import this one before Django's app registry is
ready (the ASGI application's import).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from eventbus.bus.keys import JobKeys
from eventbus.jobtypes import UnknownJobType
from eventbus.redis.clients import get_redis

if TYPE_CHECKING:
    from eventbus.models import Job, StageRecord

logger = logging.getLogger(__name__)

# The job model's view permission (superusers have it): it opens every user's jobs. is_staff
# alone opens none; it only lets a user into the admin, where model permissions rule too.
VIEW_EVERY_JOB = "eventbus.view_job"
STATES_BATCH = 500  # ids per query (job_states): well under any database's limit on parameters


def visible_jobs(user):
    """A user sees their own jobs; a user with the job model's view permission sees every job."""
    from eventbus.models import Job

    if not user.is_authenticated:
        return Job.objects.none()
    if user.has_perm(VIEW_EVERY_JOB):
        return Job.objects.all()
    return Job.objects.filter(owner=user)


def sees(user, job: Job) -> bool:
    """Whether `user` sees `job` (visible_jobs' rule, for one job read already): its owner does
    without the permission check, which reads the user's and their groups' permissions (two
    queries) otherwise."""
    return user.is_authenticated and (job.owner_id == user.pk or user.has_perm(VIEW_EVERY_JOB))


def visible_job(user, job_id) -> Job | None:
    """The job, if `user` sees it (sees), else None; with its `retried_by`."""
    from eventbus.models import Job

    if not user.is_authenticated:
        return None
    job = with_retried_by(Job.objects.filter(id=job_id)).first()
    return job if job is not None and sees(user, job) else None


def with_retried_by(jobs):
    """The jobs, each with `retried_by`: the id of its retry (a job has at most one), or None;
    in the same query (a subquery on the UNIQUE retry_of), not one more per job."""
    from django.db.models import OuterRef, Subquery

    from eventbus.models import Job

    return jobs.annotate(retried_by=Subquery(Job.objects.filter(retry_of=OuterRef("pk")).values("pk")[:1]))


def retry_id(job):
    """The id of the job's retry, or None (a job has at most one)."""
    from eventbus.models import Job

    return Job.objects.filter(retry_of=job).values_list("pk", flat=True).first()


def job_list(user, *, state: str | None = None, domain: str | None = None):
    """The jobs `user` sees, newest first, each with `retried_by` (with_retried_by); the list
    shows no payload: it is not read."""
    jobs = visible_jobs(user)
    if state:
        jobs = jobs.filter(state=state)
    if domain:
        jobs = jobs.filter(domain=domain)
    # The id breaks ties of one instant, so that pages neither repeat nor skip a job.
    return with_retried_by(jobs.defer("payload")).order_by("-accepted_at", "-id")


def job_to_stream(user, job_id) -> Job | None:
    """What a job's WebSocket stream needs of it (its id, type, state and acceptance time), if
    `user` sees it, else None."""
    from eventbus.models import Job

    if not user.is_authenticated:
        return None
    job = Job.objects.filter(id=job_id).only("id", "domain", "state", "accepted_at", "owner_id").first()
    return job if job is not None and sees(user, job) else None


def job_outcome(job_id) -> Job:
    """The job's state and type, read again (Job.DoesNotExist when it was deleted)."""
    from eventbus.models import Job

    return Job.objects.only("state", "domain").get(pk=job_id)


def job_states(job_ids: list) -> dict:
    """{job id: state} of the jobs that exist among `job_ids` (one query per 500 of them)."""
    from eventbus.models import Job

    found: dict = {}
    for start in range(0, len(job_ids), STATES_BATCH):
        found.update(
            Job.objects.filter(pk__in=job_ids[start : start + STATES_BATCH]).values_list("pk", "state")
        )
    return found


def jobs_to_retry(*, states=("FAILED",), domain: str | None = None, since: datetime | None = None):
    """Jobs that ended in one of `states` (of `domain`; ended since `since`) and have no retry
    yet, oldest first: what the retry_jobs command retries."""
    from eventbus.models import Job

    states = tuple(states)
    not_retryable = set(states) - set(Job.RETRYABLE_STATES)
    if not_retryable:
        raise ValueError(f"Only {', '.join(Job.RETRYABLE_STATES)} jobs can be retried, not {not_retryable}")
    jobs = Job.objects.filter(state__in=states, retries__isnull=True)
    if domain:
        jobs = jobs.filter(domain=domain)
    if since is not None:
        jobs = jobs.filter(completed_at__gte=since)
    return jobs.order_by("completed_at", "accepted_at")


def job_stage_records(job) -> list[StageRecord]:
    """The job's stage records, in one query (results, events and tracebacks, the large parts,
    are not read)."""
    from eventbus.models import StageRecord

    return list(StageRecord.objects.filter(job=job).defer("result", "events", "error_traceback"))


def latest_event(domain: str, job_id: str) -> dict | None:
    """The job's latest published event (its state KV), or None when there is none (yet,
    or any more: the state expires after EVENTBUS['STATE_TTL']) or Redis cannot answer."""
    try:
        raw = get_redis().get(JobKeys(domain, job_id).state)
    except (RedisError, UnknownJobType):
        logger.warning("latest event of %s %s unavailable", domain, job_id, exc_info=True)
        return None
    if not raw:
        return None
    try:
        return json_object(raw)
    except ValueError:
        # Only a writer other than the bus's scripts puts this there: no answer, not a 500.
        logger.warning("latest event of %s %s is not a JSON object; ignored", domain, job_id)
        return None


def json_object(raw: bytes) -> dict:
    """A JSON object read back from Redis; ValueError for anything else (not JSON, nested past
    the parser's recursion limit, or another type), which only a foreign writer leaves there."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deep") from None
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not an object")
    return value


@dataclass(frozen=True, slots=True)
class Backfill:
    """What a watcher of a job needs to catch up, read in one round trip."""

    entries: list[tuple[bytes, dict]]  # history events with seq > after, in seq order: (raw, parsed)
    applied: int | None  # the router's last applied seq; None: it has none (any more)
    latest: dict | None  # the job's newest published event (its state KV), if any


async def read_backfills(client, asks: list[tuple[str, str, int]]) -> list[Backfill | ValueError]:
    """Each job's history after seq `after`, its applied seq and its latest event, for many
    jobs, (domain, job_id, after) each, in one pipelined round trip (on a cluster, one per
    master; async client): after a Redis blip a gateway resyncs every job it streams.
    A job whose keys hold what is not JSON gets its ValueError, the others their Backfill."""
    async with client.pipeline(transaction=False) as pipe:
        for domain, job_id, after in asks:
            keys = JobKeys(domain, job_id)
            pipe.zrangebyscore(keys.history, f"({after}", "+inf")
            # One command for both: they share the job's hash tag (one slot on a cluster), and
            # each command costs the client and Redis more than its keys do. (redis-py refuses
            # pipe.mget on a cluster pipeline, whatever the keys' slots.)
            pipe.execute_command("MGET", keys.applied, keys.state)
        replies = await pipe.execute()
    return [
        _backfill(raws, *applied_and_state) for raws, applied_and_state in zip(replies[0::2], replies[1::2])
    ]


def _backfill(raws, applied, state) -> Backfill | ValueError:
    try:
        return Backfill(
            [(raw, json_object(raw)) for raw in raws],
            None if applied is None else int(applied),
            json_object(state) if state is not None else None,
        )
    except ValueError as exc:
        return exc


@dataclass(frozen=True, slots=True)
class StageRow:
    """One stage of a job as the admin's timeline shows it: a declared stage, or a recorded one
    its type no longer declares (or of a type no longer registered)."""

    name: str
    label: str
    state: str  # StageRecord.state, or PENDING for a declared stage without a record
    record: StageRecord | None


@dataclass(frozen=True, slots=True)
class StageDetail:
    """One stage of a job as its owner sees it (the jobs API's detail): a row of job_stages()
    with its record's counts and times, and its error, if any."""

    name: str
    label: str
    state: str  # STAGE_STATES
    attempts: int  # runs that started the stage (0: no record yet)
    started_at: datetime | None
    finished_at: datetime | None
    # The last failure of an attempt ({"type", "message"}), until an attempt finishes the stage;
    # None for a stage a cancel stopped: its JobCancelled is for staff (the admin).
    error: dict | None
    # What the stage waits for ("sleep", "signal:<name>[,<name>...]", "children"), or None.
    waiting_for: str | None = None


@dataclass(frozen=True, slots=True)
class JobChild:
    """A job a stage of another started (ctx.start_child), as its parent's detail lists it."""

    id: uuid.UUID
    domain: str
    state: str


@dataclass(frozen=True, slots=True)
class JobDetail:
    """One job as its owner sees it, read in full (job_detail()): its row's fields, its latest
    event, its error, its stages, its children, the signals it takes and what it waits for. A
    value, read once: nothing is set on a model instance."""

    id: uuid.UUID
    domain: str  # the job's type (named `domain` on the wire and in the model)
    state: str
    payload: dict
    accepted_at: datetime
    run_after: datetime | None  # a delayed start
    completed_at: datetime | None
    retry_of_id: uuid.UUID | None  # the job this one retries (named as the model's attribute)
    retried_by: uuid.UUID | None  # the job that retries this one, if any
    latest_event: dict | None  # latest_event(): while Redis keeps it (EVENTBUS["STATE_TTL"])
    error: dict | None  # job_error(): why a FAILED job failed
    stages: tuple[StageDetail, ...]
    parent_id: uuid.UUID | None = None  # the job whose stage started this one (ctx.start_child)
    children: tuple[JobChild, ...] = ()  # the jobs its stages started, oldest first
    signals: tuple[str, ...] = ()  # the signals its type declares (Stage.signals)
    waiting_for: str | None = None  # what its waiting stage waits for (StageRecord.waiting_for)


def job_detail(user, job_id) -> JobDetail | None:
    """The job with its latest event, error, stages and children, if `user` sees it
    (visible_jobs), else None: the jobs API's GET /api/jobs/<job_id>/.

    Parameters
    ----------
    user : User
        Who asks: their own jobs, or every job with the job model's view permission.
    job_id : uuid.UUID or str
        The job's id.
    """
    job = visible_job(user, job_id)
    if job is None:
        return None
    latest = latest_event(job.domain, str(job.id))
    records = job_stage_records(job)  # one query: the stages and the job's error come from it
    stages = tuple(stage_details(job, records))
    return JobDetail(
        id=job.id,
        domain=job.domain,
        state=job.state,
        payload=job.payload,
        accepted_at=job.accepted_at,
        run_after=job.run_after,
        completed_at=job.completed_at,
        retry_of_id=job.retry_of_id,
        retried_by=job.retried_by,  # type: ignore[attr-defined]  # visible_job's annotation
        latest_event=latest,
        error=job_error(job, latest, records),
        stages=stages,
        parent_id=job.parent_id,
        children=job_children(user, job),
        signals=job_signal_names(job.domain),
        waiting_for=None if job.ended else next((s.waiting_for for s in stages if s.waiting_for), None),
    )


def job_children(user, job) -> tuple[JobChild, ...]:
    """The jobs the job's stages started (ctx.start_child) that `user` sees, oldest first, in
    one query."""
    rows = (
        visible_jobs(user)
        .filter(parent=job)
        .order_by("accepted_at", "id")
        .values_list("id", "domain", "state")
    )
    return tuple(JobChild(*row) for row in rows)


def job_signal_names(domain: str) -> tuple[str, ...]:
    """The signals a job of this type takes (its stages' Stage.signals); none for a type no
    longer registered."""
    from eventbus.jobtypes import job_type

    try:
        return job_type(domain).signal_names()
    except UnknownJobType:
        return ()


def job_error(job, latest: dict | None, records) -> dict | None:
    """Why a FAILED job failed: {"stage", "type", "message"}, from the stage's record (stage
    None: it failed outside any stage, and only its final event, while Redis keeps it, says why);
    None for a job in any other state.

    Parameters
    ----------
    job : Job
        The job.
    latest : dict or None
        Its latest event (latest_event()).
    records : list of StageRecord
        Its stage records (job_stage_records()), read once by the caller.
    """
    from eventbus.models import Job

    if job.state != Job.State.FAILED:
        return None
    failure = recorded_failure(records)
    if failure is None and latest is not None:
        data = latest.get("data")
        if isinstance(data, dict) and data.get("final") is True and isinstance(data.get("error"), dict):
            told = data["error"]  # read back from Redis: its shape is checked, not trusted
            stage = told.get("stage")
            failure = {
                "stage": stage if isinstance(stage, str) else None,
                "type": str(told.get("type", "")),
                "message": str(told.get("message", "")),
            }
    return failure


def recorded_failure(records) -> dict | None:
    """The failure kept on the job's unfinished stage that failed last ({"stage", "type",
    "message"}, as eventbus.job.stages.describe records it), or None; `records` are the job's stage
    records, as the caller read them already."""
    failed = [r for r in records if r.finished_at is None and r.error_type is not None]
    if not failed:
        return None
    record = max(failed, key=lambda r: r.failed_at)
    return {"stage": record.stage, "type": record.error_type, "message": record.error_message or ""}


def stage_details(job, records) -> list[StageDetail]:
    """Every stage of the job (job_stages(): its type's declared stages in order, then recorded
    ones its type no longer declares) as its owner sees it."""
    details = []
    for row in job_stages(job, records):
        record = row.record
        details.append(
            StageDetail(
                name=row.name,
                label=row.label,
                state=row.state,
                attempts=record.attempts if record else 0,
                started_at=record.started_at if record else None,
                finished_at=record.finished_at if record else None,
                # A cancel is no failure: its record's JobCancelled is for staff (the admin).
                error=None if row.state == "CANCELLED" else _stage_error(record),
                waiting_for=record.waiting_for if record and record.finished_at is None else None,
            )
        )
    return details


def _stage_error(record) -> dict | None:
    if record is None or not record.error_type:
        return None
    return {"type": record.error_type, "message": record.error_message or ""}


def job_stages(job, records=None) -> list[StageRow]:
    """Every stage of the job: its type's declared stages in order, each with its record (or
    PENDING), then the records of stages the type does not declare, by when they started."""
    from eventbus.jobtypes import UnknownJobType, job_type

    if records is None:
        records = list(job.stage_records.all())
    by_name = {record.stage: record for record in records}
    try:
        planned = job_type(job.domain).plan()
    except UnknownJobType:
        planned = []
    rows = []
    for stage in planned:
        record = by_name.pop(stage.name, None)
        rows.append(StageRow(stage.name, stage.label, record.state if record else "PENDING", record))
    for record in sorted(by_name.values(), key=lambda r: r.started_at):
        rows.append(StageRow(record.stage, record.stage, record.state, record))
    return rows
