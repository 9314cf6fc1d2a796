"""Helpers for testing job types: run one in memory, without Redis, a database or a worker.

from eventbus.testing import events_of
assert [seq for _stage, seq, _data in events_of("transcode", {"url": "..."})] == [10, 20, 51]
"""

from __future__ import annotations

from .jobtypes import FINAL_STAGE, JobType, job_type
from .stages import StageContext, final_event_data, run_stage


def events_of(
    job: str | type[JobType], payload: dict | None = None, *, job_id: str = "test-job"
) -> list[tuple]:
    """(stage, seq, data) of every event a completed run of the job publishes, final included."""
    job_class = job_type(job) if isinstance(job, str) else job
    instance = job_class()
    payload = instance.clean_payload(dict(payload or {}))
    events: list[tuple] = []
    results: dict = {}

    def emit(stage: str, seq: int, data: dict) -> None:
        events.append((stage, seq, data))

    for planned in job_class.plan():
        ctx = StageContext(job_id, job_class.name, payload, planned.name, 1, dict(results), planned, emit)
        results[planned.name] = run_stage(instance, ctx)
    final = final_event_data(job_class, "COMPLETED", **(instance.outcome(results) or {}))
    events.append((FINAL_STAGE, job_class.final_seq(), final))
    return events
