"""A stage's durable waits: sleep, signals and child jobs, each without a worker slot.

A stage that waits ends its attempt (StageWaiting): its run records what it waits for on the
stage's record (`waiting_for`) and its durable memory (`waits`), puts the job WAITING
(eventbus.job.lifecycle.wait) with the time it resumes, if known (`run_after`), and lets its
worker go. The sweeper (`sweep_jobs`) sends the run again once that time is due; a signal sent to
the job, or the end of its last child, wakes it sooner. The stage then runs again from its
start, as after any interruption, and each wait its code asked for before is found in `waits`:
a sleep whose time has passed returns at once, a signal sent meanwhile is returned, children
started before are the same jobs (their keys are the parent's, the stage's and their index).

So a stage's code before a wait runs again after it: keep it cheap and idempotent (or put it
in an earlier stage), as with any re-run.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from eventbus.job import accepting, stagerecords
from eventbus.jobtypes import JobType, StageTimeout
from eventbus.models import Job, JobSignal, StageRecord
from idempotency.scope import join_scope

# A stage's context (eventbus.job.stages.StageContext, which imports this module).
StageContext = Any

# Where a stage's children keep their keys: three parts, which no request's scope can be.
CHILD_SCOPE_PREFIX = ("child", "eventbus")
# StageRecord.waiting_for's length: "signal:" and the names a wait_for waits for, joined by ",".
WAITING_FOR_LENGTH = StageRecord._meta.get_field("waiting_for").max_length or 100


class StageWaiting(BaseException):  # noqa: N818
    """Raised by ctx.sleep, ctx.wait_for and ctx.wait_children to end the attempt while the stage
    waits (a BaseException: a stage's `except Exception` does not swallow it).

    `until`: when the run resumes anyway (a sleep's end, a signal's timeout; None: when woken);
    `ready`: whether what it waits for has come meanwhile (asked once the job is WAITING: a
    signal or a child's end that came just before finds the job not WAITING yet, and does not
    wake it)."""

    def __init__(
        self, stage: str, waiting_for: str, *, until: datetime | None, ready: Callable[[], bool] | None = None
    ):
        super().__init__(
            f"Stage {stage!r} waits for {waiting_for}" + (f" until {until.isoformat()}" if until else "")
        )
        self.stage, self.waiting_for, self.until, self.ready = stage, waiting_for, until, ready


def _seconds(duration: float | timedelta) -> float:
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
    if not seconds >= 0:  # NaN too
        raise ValueError(f"A wait must be a number of seconds >= 0 or a timedelta, not {duration!r}")
    return seconds


def _due(value) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) else None


def sleep(ctx: StageContext, duration: float | timedelta) -> None:
    """See StageContext.sleep."""
    seconds = _seconds(duration)
    key = ctx._next_wait("sleep")
    now = timezone.now()
    due = _due(ctx.waits.get(key))
    if due is None:
        due = now + timedelta(seconds=seconds)
        ctx.waits[key] = due.isoformat()
    if due <= now:
        return
    raise StageWaiting(ctx.stage, "sleep", until=due)


def wait_for(ctx: StageContext, names: tuple[str, ...], timeout: float | timedelta | None = None) -> Any:
    """See StageContext.wait_for."""
    declared = ctx._planned.stage.signals
    names = tuple(dict.fromkeys(names))
    for name in names:
        if name not in declared:
            raise ValueError(
                f"Stage {ctx.stage!r} declares no signal {name!r} (Stage(signals=...)): {list(declared)}"
            )
    key = f"signal:{','.join(names)}"
    if len(key) > WAITING_FOR_LENGTH:
        raise ValueError(
            f"Stage {ctx.stage!r}: the names of one wait take at most {WAITING_FOR_LENGTH - 7} characters"
        )
    sent = take_signal(ctx.job_id, *names)
    if sent is not None:
        return sent.payload if len(names) == 1 else (sent.name, sent.payload)
    now = timezone.now()
    if key not in ctx.waits:
        ctx.waits[key] = None if timeout is None else (now + timedelta(seconds=_seconds(timeout))).isoformat()
    deadline = _due(ctx.waits[key])
    if deadline is not None and deadline <= now:
        # The timed-out wait is forgotten: a retry of the stage (its Stage.retries) waits afresh.
        del ctx.waits[key]
        stagerecords.forget_wait(ctx.job_id, ctx.stage, waits=ctx.waits)
        raise StageTimeout(f"Stage {ctx.stage!r}: no signal {' or '.join(map(repr, names))} came in time")
    job_id = ctx.job_id
    raise StageWaiting(
        ctx.stage,
        key,
        until=deadline,
        ready=lambda: JobSignal.objects.filter(job_id=job_id, name__in=names).exists(),
    )


def take_signal(job_id, *names: str) -> JobSignal | None:
    """The signal sent to the job among `names`, marked delivered (None: none sent yet): the one
    delivered before, if any (what an earlier attempt of the wait took), else the first sent."""
    sent = list(JobSignal.objects.filter(job_id=job_id, name__in=names).order_by("sent_at", "pk"))
    taken = next((signal for signal in sent if signal.delivered_at is not None), sent[0] if sent else None)
    if taken is not None and taken.delivered_at is None:
        JobSignal.objects.filter(pk=taken.pk, delivered_at__isnull=True).update(delivered_at=timezone.now())
    return taken


def start_child(ctx: StageContext, job_type: str | type[JobType], payload: dict) -> Job:
    """See StageContext.start_child."""
    parent = ctx._job
    assert parent is not None, "start_child() runs in a job's stage"
    if ctx._planned.stage.atomic:
        # The child's row would be rolled back with the stage's wait for it, for ever.
        raise ValueError(f"Stage {ctx.stage!r} is atomic: start children in a stage that is not")
    index = ctx._next_wait("child").split(":", 1)[1]
    key = f"{ctx.root_id or ctx.job_id}:{ctx.stage}:{index}"
    job, _created = accepting.accept(
        job_type,
        payload,
        key=key,
        owner=parent.owner,
        scope=join_scope(*CHILD_SCOPE_PREFIX, accepting.owner_scope(parent.owner)),
        deadline=None,
        run_after=None,
        queue=parent.queue,
        priority=parent.priority,
        on_accepted=ctx._send or (lambda job: None),
        parent=parent,
    )
    ctx.waits[f"child:{index}"] = str(job.id)
    ctx._children.append(job.id)
    return job


def wait_children(ctx: StageContext) -> list[dict]:
    """See StageContext.wait_children."""
    ids = list(ctx._children)
    if not ids:
        return []
    children = {job.id: job for job in Job.objects.filter(pk__in=ids)}
    if any(not children[i].ended for i in ids if i in children):
        raise StageWaiting(ctx.stage, "children", until=None, ready=lambda: _all_ended(ids))
    results: dict[Any, dict] = {i: {} for i in ids}
    for record in StageRecord.objects.filter(job_id__in=ids, finished_at__isnull=False).only(
        "job_id", "stage", "result"
    ):
        results[record.job_id][record.stage] = record.result
    return [
        {
            "job_id": str(i),
            "domain": children[i].domain,
            "state": children[i].state,
            "results": results[i],
        }
        for i in ids
        if i in children
    ]


def _all_ended(ids) -> bool:
    return not Job.objects.filter(pk__in=ids, state__in=Job.UNFINISHED_STATES).exists()
