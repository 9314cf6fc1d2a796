"""Running a job's stages effectively once (the work behind eventbus.jobs.run).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import F
from django.utils import timezone

from .jobtypes import FINAL_STAGE, JobType, PlannedStage
from .models import StageRecord
from .publish import publish_event

logger = logging.getLogger(__name__)


class DeadlinePassed(Exception):
    """The job passed its deadline while a stage ran."""


@dataclass
class StageContext:
    """What a stage's work gets: its job, its payload, the results of the stages before it,
    a stable idempotency key, and `report()` for progress events."""

    job_id: str
    domain: str
    payload: dict
    stage: str
    attempt: int  # 1 on the first run that started this stage, 2 on the next...
    results: dict[str, Any]
    _planned: PlannedStage
    _emit: Callable[[str, int, dict], None]
    events: list = field(default_factory=list)

    @property
    def key(self) -> str:
        """`<job id>:<stage>`: the same on every run of this stage of this job."""
        return f"{self.job_id}:{self.stage}"

    def report(
        self, *, done: float | None = None, of: float | None = None, progress: int | None = None, **data
    ) -> None:
        """Publish a progress event of this stage now. `done`/`of` place it within the stage
        (the stage's share of the job's progress), `progress` sets the job's percentage
        outright; other keywords are the event's data (JSON)."""
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


def run_stages(operation, job: JobType, *, after_event: Callable[[], None]) -> dict:
    """Run the job's stages in order; returns the results by stage name. `after_event` runs
    after every event published (it renews the run lease and checks the deadline, raising to
    stop the run)."""
    job_id, domain = str(operation.op_id), operation.domain
    finished = {
        r.stage: r for r in StageRecord.objects.filter(operation=operation, finished_at__isnull=False)
    }
    results: dict[str, Any] = {}

    def emit(stage: str, seq: int, data: dict) -> None:
        if not publish_event(domain, job_id, stage, seq, data):
            logger.info("Job %s: %s seq %d was published before; duplicate dropped (L1)", job_id, stage, seq)
        after_event()

    for planned in job.plan():
        record = finished.get(planned.name)
        if record is not None:
            for stage, seq, data in record.events:
                emit(stage, seq, data)
            results[planned.name] = record.result
            continue
        attempt = _start(operation, planned.name)
        logger.info("Job %s: stage %s, attempt %d", job_id, planned.name, attempt)
        ctx = StageContext(
            job_id, domain, operation.payload, planned.name, attempt, dict(results), planned, emit
        )
        result = run_stage(job, ctx)
        _finish(operation, planned.name, result, ctx.events)
        results[planned.name] = result
    return results


def run_stage(job: JobType, ctx: StageContext):
    """One stage's work; a stage that reported nothing still gets an event: it finished."""
    result = job.work_of(ctx._planned.stage)(ctx)
    if not ctx.events:
        ctx.report(done=1, of=1)
    return result


def final_event_data(job: type[JobType] | JobType, state: str, **data) -> dict:
    return {"label": job.final_label, "progress": 100, "state": state, "final": True, **data}


def publish_final(operation, job: type[JobType] | JobType, state: str, **data) -> bool:
    return publish_event(
        operation.domain,
        str(operation.op_id),
        FINAL_STAGE,
        job.final_seq(),
        final_event_data(job, state, **data),
    )


def _start(operation, stage: str) -> int:
    record, _ = StageRecord.objects.get_or_create(operation=operation, stage=stage)
    StageRecord.objects.filter(pk=record.pk).update(attempts=F("attempts") + 1, started_at=timezone.now())
    return record.attempts + 1


def _finish(operation, stage: str, result, events: list) -> None:
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"Stage {stage!r} must return JSON-serialisable data (it is recorded): {exc}"
        ) from exc
    StageRecord.objects.filter(operation=operation, stage=stage, finished_at__isnull=True).update(
        result=result, events=events, finished_at=timezone.now()
    )
