"""Running a job's stages effectively once (the work behind eventbus.job.runs.run).

Each stage's result and the events it reported are recorded in one database write when the
stage finishes (StageRecord). A re-run of the job (its worker killed, its task redelivered)
republishes a finished stage's recorded events, which the bus drops as duplicates (L1) or
restores if Redis lost them, reuses its result, and runs only the stages not finished: the
one in flight runs again, and its events that reached the stream before are dropped as
duplicates. `StageContext.key` is stable across runs, for outside APIs' idempotency keys.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from eventbus import metrics
from eventbus.bus.publish import publish_event
from eventbus.conf import eventbus_settings
from eventbus.job import stagerecords
from eventbus.job import waits as durable_waits
from eventbus.job.waits import StageWaiting
from eventbus.jobtypes import FINAL_STAGE, JobCancelled, JobFailed, JobType, PlannedStage, StageTimeout
from eventbus.models import Job, StageRecord
from exactly_once.jsontext import json_unstorable, nested_deeper_than
from exactly_once.tracing import failed, span
from idempotency.transactions import write_transaction

logger = logging.getLogger(__name__)

# A failure's message as the job's owner sees it (the job's detail, its final event), and its
# traceback as staff see it (the admin), at most this long.
MAX_ERROR_MESSAGE = 1_000
MAX_TRACEBACK = 20_000
# StageRecord.workers keeps the last MAX_WORKERS attempts' workers.
MAX_WORKERS = 1_000


def worker_id() -> str:
    """Who runs an attempt (StageRecord.workers): this process, `<host>:<pid>` (asked at each
    attempt: a prefork pool's processes are forked after import)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def class_path(cls: type) -> str:
    """`module.QualName` of an exception's class, as django.tasks' TaskError names it."""
    return f"{cls.__module__}.{cls.__qualname__}"[:255]


class RunStopped(Exception):
    """Raised by the engine to stop a run, never the stage's failure (not retried, not recorded)."""


class RunTakenOver(RunStopped):
    """Another run took the job over (this one outlived its lease): this one stops, and what it
    did in an atomic stage is rolled back, since the other run finished that stage."""


class DeadlinePassed(RunStopped):
    """The job passed its deadline while a stage ran."""


class StageRetry(Exception):
    """A stage's attempt failed and its retry waits `countdown` seconds: the run stops and its
    task is sent again with that countdown (eventbus.tasks), holding no worker meanwhile."""

    def __init__(self, job_id: str, stage: str, countdown: float):
        super().__init__(f"Job {job_id}: stage {stage} is retried in {countdown:.2f}s")
        self.stage, self.countdown = stage, countdown


@dataclass
class StageContext:
    """What a stage's work gets: its job, its payload, the results of the stages before it,
    a stable idempotency key, `report()` for progress events, and `cancelled`/`check()` to
    stop early when the job is cancelled or the attempt is past its Stage.timeout."""

    job_id: str
    domain: str
    payload: dict
    stage: str
    attempt: int  # 1 on the first run that started this stage, 2 on the next...
    results: dict[str, Any]
    _planned: PlannedStage
    _emit: Callable[[str, int, dict], None]
    events: list = field(default_factory=list)
    # The first job of the job's retry chain (eventbus.retry_job): its id makes the key.
    root_id: str | None = None
    # Whether the job was cancelled (eventbus.job.cancellation.requested); None: never.
    is_cancelled: Callable[[], bool] | None = None
    started: float = field(default_factory=time.monotonic)
    # The stage's durable waits (StageRecord.waits), as this attempt finds and adds to them.
    waits: dict = field(default_factory=dict)
    _job: Job | None = None
    # Sends a job's run (a child's, once its accepting transaction commits); None: the sweeper does.
    _send: Callable[[Job], None] | None = None
    _wait_counts: dict = field(default_factory=dict)
    _children: list = field(default_factory=list)

    @property
    def key(self) -> str:
        """`<job id>:<stage>`: the same on every attempt and run of this stage of this job, and
        of the jobs that retry it (the id is the retry chain's first job's)."""
        return f"{self.root_id or self.job_id}:{self.stage}"

    @property
    def cancelled(self) -> bool:
        """True once the job is cancelled: stop early (return, or raise JobCancelled). Raises
        StageTimeout past the stage's timeout."""
        self.check_timeout()
        return self.is_cancelled is not None and self.is_cancelled()

    def check(self) -> None:
        """Raise JobCancelled when the job is cancelled, StageTimeout past the stage's timeout.
        `report()` calls it: a stage that reports is stopped at its next report."""
        if self.cancelled:
            raise JobCancelled(f"Job {self.job_id} was cancelled during stage {self.stage!r}")

    def sleep(self, duration: float | timedelta) -> None:
        """Wait `duration` (seconds, or a timedelta) without holding a worker: the attempt ends,
        the job is WAITING until then, and the stage runs again from its start; this call, asked
        again, then returns at once. The due time is kept with the job: it survives restarts of
        every process and of Redis. A cancel ends the wait at once (the job ends CANCELLED)."""
        durable_waits.sleep(self, duration)

    def wait_for(self, name: str, *more: str, timeout: float | timedelta | None = None):
        """The payload of the signal `name` sent to the job (eventbus.signal_job, the jobs API,
        the admin), waiting for it without holding a worker (the job is WAITING; the signal wakes
        it). A signal sent before the stage waits is kept for it. Past `timeout` (seconds or a
        timedelta; None: no limit) raises StageTimeout, which the stage's retries apply to.
        `name` must be one of the stage's `Stage(signals=...)`.

        With more names (`ctx.wait_for("approve", "reject")`), whichever of them comes first:
        returns `(name, payload)` of that one (the same on every later attempt)."""
        return durable_waits.wait_for(self, (name, *more), timeout)

    def start_child(self, job_type, payload: dict) -> Job:
        """Start a child job of this one (its `parent`), once per (job, stage, index of this
        call in the stage) whatever the re-runs: the same call on a later attempt gives the same
        job. Returns the child Job. Cancelling this job cancels its unfinished children."""
        return durable_waits.start_child(self, job_type, payload)

    def wait_children(self) -> list[dict]:
        """Wait, without holding a worker, until every child this attempt started (start_child)
        has ended; returns each one's `{"job_id", "domain", "state", "results"}` (its finished
        stages' results by stage), in the order they were started."""
        return durable_waits.wait_children(self)

    def _next_wait(self, kind: str) -> str:
        count = self._wait_counts[kind] = self._wait_counts.get(kind, 0) + 1
        return f"{kind}:{count}"

    def check_timeout(self) -> None:
        timeout = self._planned.stage.timeout
        if timeout is not None and time.monotonic() - self.started > timeout:
            raise StageTimeout(f"Stage {self.stage!r} ran past its timeout of {timeout:g}s")

    def report(
        self, *, done: float | None = None, of: float | None = None, progress: int | None = None, **data
    ) -> None:
        """Publish a progress event of this stage now. `done`/`of` place it within the stage
        (the stage's share of the job's progress), `progress` sets the job's percentage
        outright; other keywords are the event's data (JSON). Raises JobCancelled or
        StageTimeout instead (see check())."""
        self.check()
        if progress is None:
            progress = (
                self._planned.progress(done, 1 if of is None else of)
                if done is not None
                else self._planned.progress(0, 1)
            )
        event = {"label": self._planned.label, "progress": int(progress), **data}
        seq = self._planned.seq(len(self.events))
        self._emit(self.stage, seq, event)
        self.events.append([self.stage, seq, event])


def run_stages(
    job: Job,
    job_type: JobType,
    *,
    after_event: Callable[[], None],
    is_cancelled: Callable[[], bool] | None = None,
    root_id: str | None = None,
    send: Callable[[Job], None] | None = None,
    first: bool = False,
) -> dict:
    """Run the job's stages in order; returns the results by stage name. `after_event` runs
    after every event published (it renews the run lease and checks the deadline, raising to
    stop the run). `is_cancelled` says whether the job was cancelled (cheaply: the running
    stage asks it at each report); before each stage the database is asked. `root_id`: the
    retry chain's first job (the stages' keys). `send`: sends a job's run (a child's). `first`: the
    job's first run, which took it from PENDING: it has no stage record to read.

    Raises StageWaiting (a stage waits: its record says for what), JobCancelled (the job was cancelled: no later stage starts), StageRetry (a failed
    attempt's retry waits), or the stage's exception (the job fails)."""
    job_id, domain = str(job.id), job.domain
    records = {} if first else {r.stage: r for r in StageRecord.objects.filter(job=job)}
    finished = {name: r for name, r in records.items() if r.finished_at is not None}
    results: dict[str, Any] = {}
    plan = job_type.plan()
    # The stage whose start the last finish wrote with it (stagerecords: one write per stage),
    # and whether the job's cancel was found requested by that write.
    started: str | None = None
    cancelled = False

    def emit(stage: str, seq: int, data: dict) -> None:
        if not publish_event(domain, job_id, stage, seq, data):
            logger.info("Job %s: %s seq %d was published before; duplicate dropped (L1)", job_id, stage, seq)
        after_event()

    for index, planned in enumerate(plan):
        record = finished.get(planned.name)
        if record is not None:
            for stage, seq, data in record.events:
                emit(stage, seq, data)
            results[planned.name] = record.result
            continue
        if started != planned.name:
            if (due := _retry_due_in(records.get(planned.name))) > 0:
                if not stagerecords.cancel_requested(job.pk):
                    # A run before the retry is due (a duplicate message, the recovery): it waits too.
                    raise StageRetry(job_id, planned.name, due)
                cancelled = True
            else:
                cancelled = stagerecords.save([_started(records, job, planned.name)])
        if cancelled:
            # The database's word (Redis may have lost the cancel flag), read with the write
            # that started this stage: it is recorded as where the cancel stopped the job.
            stopped = JobCancelled(f"Job {job_id} was cancelled before stage {planned.name!r}")
            if planned.name in records and records[planned.name].finished_at is None:
                _record_failure(job, planned.name, stopped)
            raise stopped
        attempt = records[planned.name].attempts
        logger.info("Job %s: stage %s, attempt %d", job_id, planned.name, attempt)
        ctx = StageContext(
            job_id,
            domain,
            job.payload,
            planned.name,
            attempt,
            dict(results),
            planned,
            emit,
            root_id=root_id,
            is_cancelled=is_cancelled,
            waits=dict(records[planned.name].waits or {}),
            _job=job,
            _send=send,
        )
        outcome = None  # the attempt's, for the metrics (none: the run was taken over)
        following = plan[index + 1].name if index + 1 < len(plan) else None
        # A wait, a stopped run, a cancel and a retry (its failure is recorded below) are no
        # failure of the attempt's span.
        with span(
            "eventbus.stage",
            expected=(StageWaiting, RunStopped, JobCancelled, StageRetry),
            job_id=job_id,
            domain=domain,
            stage=planned.name,
            attempt=attempt,
        ) as traced:
            try:
                if planned.stage.atomic:
                    # Its ORM writes and the write that records it finished commit together, once.
                    # Its events are published once that commits: none from an attempt rolled
                    # back, and no Redis round trip while the transaction (on SQLite, the
                    # database's one write lock) is held.
                    ctx._emit = lambda stage, seq, data: None
                    with write_transaction():
                        result = run_stage(job_type, ctx)
                        started, cancelled = _finish(
                            records,
                            job,
                            planned.name,
                            result,
                            ctx.events,
                            then_start=following,
                            waits=ctx.waits,
                        )
                        if not stagerecords.finished_as(job, planned.name, records[planned.name].finished_at):
                            # A run that took the job over finished the stage first (its
                            # commit is what ours waited for): ours is rolled back, rows and all.
                            raise RunTakenOver(
                                f"Job {job_id}: stage {planned.name} was finished by another run"
                            )
                    _warn_if_long(job_id, planned.name, ctx.started)
                    for stage, seq, data in ctx.events:
                        emit(stage, seq, data)
                else:
                    result = run_stage(job_type, ctx)
                    started, cancelled = _finish(
                        records, job, planned.name, result, ctx.events, then_start=following, waits=ctx.waits
                    )
                outcome = "completed"
            except StageWaiting as waiting:
                outcome = "waiting"
                stagerecords.record_wait(job, planned.name, waits=ctx.waits, waiting_for=waiting.waiting_for)
                records[planned.name].waiting_for = waiting.waiting_for
                raise
            except RunStopped as exc:
                outcome = "timed_out" if isinstance(exc, DeadlinePassed) else None
                raise  # no fault of the stage's
            except JobCancelled as exc:
                outcome = "cancelled"
                _record_failure(job, planned.name, exc)  # where the cancel stopped the job
                raise
            except Exception as exc:
                outcome = "failed"
                if is_cancelled is not None and _cancelled_anyway(is_cancelled):
                    outcome = "cancelled"
                    # Stopping, it failed: not retried, and recorded as the cancel that stopped it
                    # (the stage reads CANCELLED), the failure kept as its cause in the traceback.
                    stopped = JobCancelled(f"Job {job_id} was cancelled; stage {planned.name!r} stopped")
                    stopped.__cause__ = exc
                    _record_failure(job, planned.name, stopped)
                    raise stopped from exc
                if planned.stage.retryable(exc, attempt):
                    outcome = "retried"
                    delay = planned.stage.retry_delay(attempt)
                    _record_failure(job, planned.name, exc, retry_in=delay)
                    failed(traced, exc)
                    logger.warning(
                        "Job %s: stage %s attempt %d failed (%s: %s); retried in %.2fs",
                        job_id,
                        planned.name,
                        attempt,
                        type(exc).__name__,
                        exc,
                        delay,
                    )
                    raise StageRetry(job_id, planned.name, delay) from exc
                if isinstance(exc, StageTimeout):
                    outcome = "timed_out"
                _record_failure(job, planned.name, exc)
                raise
            finally:
                if outcome is not None:
                    metrics.stage_attempt(domain, planned.name, outcome, time.monotonic() - ctx.started)
                    if traced is not None:
                        traced.set_attribute("outcome", outcome)
        results[planned.name] = result
    return results


def _warn_if_long(job_id: str, stage: str, started: float) -> None:
    """An atomic stage held its transaction (and a connection, and its locks) all along: say so
    when that was long, so that its outside calls can move to a stage of their own."""
    held = time.monotonic() - started
    if held > eventbus_settings.ATOMIC_STAGE_WARN_SECONDS:
        logger.warning(
            "Job %s: atomic stage %s held its database transaction for %.1f s (over "
            "EVENTBUS['ATOMIC_STAGE_WARN_SECONDS']): keep long outside calls out of atomic stages",
            job_id,
            stage,
            held,
        )


def _cancelled_anyway(is_cancelled: Callable[[], bool]) -> bool:
    try:
        return is_cancelled()
    except Exception:
        return False


def run_stage(job_type: JobType, ctx: StageContext):
    """One stage's work, its result as recorded; a stage that reported nothing still gets an
    event: it finished."""
    result = recorded(ctx.stage, job_type.work_of(ctx._planned.stage)(ctx))
    ctx.check_timeout()  # an attempt that returns late failed all the same (its result is dropped)
    if not ctx.events:
        ctx.report(done=1, of=1)
    return result


def recorded(stage: str, result):
    """The stage's result in its JSON form, as recorded: what later stages, the outcome and a
    re-run of the job all see (a Decimal is its string, a datetime its ISO 8601 text: Django's
    JSON encoder's forms). TypeError when it has none."""
    try:
        text = json.dumps(result, cls=DjangoJSONEncoder, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(
            f"Stage {stage!r} must return JSON-serialisable data (it is recorded): {exc}"
        ) from exc
    if nested_deeper_than(result, text):
        raise TypeError(
            f"Stage {stage!r} must return JSON-serialisable data (it is recorded): nested too deep"
        )
    _refuse_nul(stage, "result", text)
    return json.loads(text)


def _refuse_nul(stage: str, what: str, text: str) -> None:
    """One answer on every database for a NUL or a lone surrogate in what a stage records: its
    job fails, clearly (PostgreSQL's jsonb refuses either; SQLite keeps a surrogate, which
    then fails every page that shows it)."""
    if (found := json_unstorable(text)) is not None:
        raise TypeError(f"Stage {stage!r}: its {what} holds {found}, which not every database stores")


def final_event_data(job_type: type[JobType] | JobType, state: str, **data) -> dict:
    return {"label": job_type.final_label, "progress": 100, "state": state, "final": True, **data}


def publish_final(job, job_type: type[JobType] | JobType, state: str, **data) -> bool:
    return publish_event(
        job.domain,
        str(job.id),
        FINAL_STAGE,
        job_type.final_seq(),
        final_event_data(job_type, state, **data),
    )


def _retry_due_in(record: StageRecord | None) -> float:
    """Seconds until the retry of the stage's failed attempt is due (0 or less: now)."""
    if record is None or record.next_attempt_at is None:
        return 0
    return (record.next_attempt_at - timezone.now()).total_seconds()


def _started(records: dict[str, StageRecord], job, stage: str) -> StageRecord:
    """The stage's record (kept in `records`), one attempt more, started now (a stage resumed
    after its wait goes on with the same attempt); not written: the caller saves it, alone or
    with the stage before it."""
    record = records.get(stage) or StageRecord(job=job, stage=stage)
    if record.waiting_for is None:
        record.attempts += 1
        record.workers = [*record.workers, worker_id()][-MAX_WORKERS:]
    record.waiting_for = None
    record.started_at = timezone.now()
    record.next_attempt_at = None
    records[stage] = record
    return record


def _finish(
    records: dict[str, StageRecord],
    job,
    stage: str,
    result,
    events: list,
    *,
    then_start: str | None,
    waits: dict | None = None,
) -> tuple[str | None, bool]:
    """Record the finished stage and, in the same write, start `then_start` (the next stage)
    unless it is finished or its retry waits. Returns the stage it started (or None) and
    whether the job's cancel was requested (the database's word, read by that write)."""
    _refuse_nul(stage, "events", json.dumps(events, cls=DjangoJSONEncoder))
    record = records[stage]
    record.result, record.events, record.finished_at = result, events, timezone.now()
    record.waits, record.waiting_for = waits if waits is not None else record.waits, None
    # An earlier attempt's failure (retried, or a run that was interrupted) is over.
    record.error_type = record.error_class = record.error_message = None
    record.error_traceback = record.failed_at = None
    following = records.get(then_start) if then_start else None
    if following is not None and (following.finished_at is not None or _retry_due_in(following) > 0):
        then_start = None  # finished already, or its retry waits: the loop tells which
    rows = [record]
    if then_start is not None:
        rows.append(_started(records, job, then_start))
    return then_start, stagerecords.save(rows)


# -- failures -------------------------------------------------------------------------------------


def _bounded(text: str, limit: int, *, keep_end: bool = False) -> str:
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :] if keep_end else text[: limit - 1] + "…"


def describe(exc: BaseException, stage: str | None = None) -> dict:
    """A failure as the job's owner sees it: the stage (None: outside any stage), the
    exception's type and its message (a JobFailed's reason), bounded. Nothing but what the
    exception says: no locals, no traceback (staff see that in the admin)."""
    try:
        message = exc.reason if isinstance(exc, JobFailed) else str(exc)
    except Exception:  # an exception whose __str__ fails
        message = ""
    return {"stage": stage, "type": type(exc).__name__, "message": _bounded(message, MAX_ERROR_MESSAGE)}


def failure_of(exc: BaseException) -> dict:
    """describe(exc), with the stage it came from when a stage raised it (run_stages says so)."""
    return getattr(exc, "_eventbus_failure", None) or describe(exc)


def _record_failure(job, stage: str, exc: Exception, *, retry_in: float | None = None) -> None:
    """Keep the failure on the stage's record (its traceback too, for the admin), and say which
    stage it came from to whoever ends the job (failure_of). Another attempt clears it when it
    finishes the stage. `retry_in`: seconds until the retry of the stage, which waits."""
    failure = describe(exc, stage)
    try:
        exc._eventbus_failure = failure  # type: ignore[attr-defined]
    except AttributeError:  # an exception type with __slots__: the failure is told without its stage
        pass
    try:
        stagerecords.record_failure(
            job,
            stage,
            error_type=failure["type"],
            error_class=class_path(type(exc)),
            error_message=failure["message"],
            error_traceback=_bounded("".join(traceback.format_exception(exc)), MAX_TRACEBACK, keep_end=True),
            retry_in=retry_in,
        )
    except Exception:  # the database away: the failure is still logged and told in the final event
        logger.warning("Job %s: could not record the failure of stage %s", job.id, stage, exc_info=True)
