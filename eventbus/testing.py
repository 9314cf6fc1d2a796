"""Helpers for testing job types: run one in memory, without Redis, a database or a worker.

from eventbus.testing import events_of

assert [seq for _stage, seq, _data in events_of("transcode", {"url": "..."})] == [10, 20, 51]

# The stage "fetch" fails on its first attempt (retried if its Stage policy says so):
run = events_of("transcode", {"url": "..."}, fail={"fetch": [ConnectionError("503"), None]})
assert run.state == "COMPLETED" and run.attempts["fetch"] == 2
"""

from __future__ import annotations

from eventbus.job.stages import StageContext, describe, final_event_data, run_stage
from eventbus.jobtypes import FINAL_STAGE, JobCancelled, JobFailed, JobType, job_type


class RunEvents(list):
    """(stage, seq, data) of the events as the bus keeps them (each (stage, seq) once, the
    first publication's), final included; with the run's final `state`, its `error` (None, or
    {"stage", "type", "message"}) and each stage's `attempts`."""

    state: str = "COMPLETED"
    error: dict | None = None

    def __init__(self) -> None:
        super().__init__()
        self.attempts: dict[str, int] = {}


def events_of(
    job: str | type[JobType],
    payload: dict | None = None,
    *,
    job_id: str = "test-job",
    fail: dict[str, list] | None = None,
) -> RunEvents:
    """Run the job's stages in memory as a worker would, with their Stage policies (retries;
    a retry waits no backoff here), and return its events as the bus keeps them.

    Parameters
    ----------
    job : str or JobType subclass
        The job's type, by its name or its class.
    payload : dict, optional
        The job's payload.
    job_id : str
        The job's id ("test-job").
    fail : dict of str to list, optional
        Failures planned per stage, as below.

    Returns
    -------
    RunEvents
        (stage, seq, data) of the events, with the run's `state`, `error` and `attempts`.

    Notes
    -----
    `fail` makes stages fail on given attempts: {"pay": [ConnectionError("503"), None]} raises
    ConnectionError instead of running the pay stage's first attempt, and runs its second (None);
    attempts past the list run normally. An exception class is raised as its instance. A
    failure the stage's policy retries runs the stage again (the same ctx.key, ctx.attempt + 1,
    its events' seqs from its range's start again: the copies are dropped, as the bus drops
    them). A planned failure that is not retried, or a JobFailed, ends the run FAILED with its
    final event (JobCancelled: CANCELLED); any other exception of the stage is raised, as
    before any retry policy: a bug in a stage fails the test that runs it.
    """
    job_class = job_type(job) if isinstance(job, str) else job
    instance = job_class()
    payload = instance.clean_payload(dict(payload or {}))
    failures = {stage: list(planned) for stage, planned in (fail or {}).items()}
    unknown = set(failures) - {stage.name for stage in job_class.stages}
    if unknown:
        raise ValueError(
            f"fail= names stages {sorted(unknown)} that {job_class.__qualname__} does not declare"
        )
    run = RunEvents()
    published: set[tuple[str, int]] = set()
    results: dict = {}

    def emit(stage: str, seq: int, data: dict) -> None:
        if (stage, seq) not in published:  # a retried attempt's copy: the bus drops it (L1)
            published.add((stage, seq))
            run.append((stage, seq, data))

    def end(state: str, **data) -> RunEvents:
        run.state = state
        run.append((FINAL_STAGE, job_class.final_seq(), final_event_data(job_class, state, **data)))
        return run

    for planned in job_class.plan():
        attempt = 0
        while True:
            attempt += 1
            run.attempts[planned.name] = attempt
            ctx = StageContext(
                job_id, job_class.name, payload, planned.name, attempt, dict(results), planned, emit
            )
            planned_failures = failures.get(planned.name, [])
            failure = planned_failures[attempt - 1] if attempt <= len(planned_failures) else None
            try:
                if failure is not None:
                    raise failure() if isinstance(failure, type) else failure
                results[planned.name] = run_stage(instance, ctx)
                break
            except JobCancelled:
                return end("CANCELLED")
            except Exception as exc:
                if planned.stage.retryable(exc, attempt):
                    continue
                if failure is None and not isinstance(exc, JobFailed):
                    raise  # the stage's own error (a bug?): the test sees it, traceback and all
                run.error = describe(exc, planned.name)
                data = exc.data if isinstance(exc, JobFailed) else {}
                return end("FAILED", **data, error=run.error)
    return end("COMPLETED", **(instance.outcome(results) or {}))
