"""The jobs benchmark's job (bench/jobs.py): four trivial stages, the same work in all three
systems, and the frames a watcher gets.

Each stage appends one line, `<key> <stage>`, to the execution log of its system
(BENCH_JOBS_EXEC_LOG, one file per system, O_APPEND: a line of a few bytes is written whole by any
process), sleeps BENCH_STAGE_MS milliseconds (0: not at all) and returns a small dict. The
log is how the bench counts executions: a job that ran twice has its lines twice, whatever the
system did about it.

Frames, the same shape in all three systems (ours' gateway sends them so; the baselines'
consumers copy it): `{"type": "event", "job_id", "stage", "seq", "data"}`, one per stage (seq 10,
20, 30, 40, `data.progress` 20..80) and a final one (seq 51, stage "done", `data.final` true).

`BenchJob` is the job as ours runs it (a JobType, EVENTBUS["JOB_TYPES"] in
bench/jobs_settings.py): each stage reports nothing, so the toolkit publishes one event when it
finishes, and the final event after the last one: the same five frames.
"""

from __future__ import annotations

import os
import time

from eventbus.jobtypes import JobType, Stage

STAGES = ("one", "two", "three", "four")
SEQS = (10, 20, 30, 40)
FINAL_SEQ = 51
EXPECTED_SEQS = (*SEQS, FINAL_SEQ)
DOMAIN = "benchjob"  # ours: the job type's name, its domain
DBOS_WORKFLOW = "bench_job"  # DBOS: the workflow's registered name
DBOS_QUEUE = "bench-jobs"
DBOS_STREAM = "progress"

_log_fd: tuple[int, int] | None = None  # (pid, fd): a forked pool process opens its own


def _log(line: str) -> None:
    global _log_fd
    path = os.environ.get("BENCH_JOBS_EXEC_LOG")
    if not path:
        return
    if _log_fd is None or _log_fd[0] != os.getpid():
        _log_fd = (os.getpid(), os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
    os.write(_log_fd[1], line.encode())


def work(key: str, stage: str) -> dict:
    """One stage's work, in every system: logged, the same small sleep (if any), a small result."""
    _log(f"{key} {stage}\n")
    pause = float(os.environ.get("BENCH_STAGE_MS") or 0) / 1000
    if pause > 0:
        time.sleep(pause)
    return {"stage": stage, "ok": True}


def progress_frame(job_id: str, index: int) -> dict:
    """The frame of stage `index` (0-3) of a job, as the baselines send it."""
    return {
        "type": "event",
        "job_id": job_id,
        "stage": STAGES[index],
        "seq": SEQS[index],
        "data": {"progress": 20 * (index + 1)},
    }


def final_frame(job_id: str) -> dict:
    return {
        "type": "event",
        "job_id": job_id,
        "stage": "done",
        "seq": FINAL_SEQ,
        "data": {"progress": 100, "final": True, "state": "COMPLETED"},
    }


class BenchJob(JobType):
    """Ours: the payload carries the client's Idempotency-Key (`key`), for the execution log."""

    name = DOMAIN
    description = "bench/jobs.py's job: four trivial stages."
    stages = tuple(Stage(name) for name in STAGES)

    def one(self, ctx):
        return work(ctx.payload.get("key", ""), "one")

    def two(self, ctx):
        return work(ctx.payload.get("key", ""), "two")

    def three(self, ctx):
        return work(ctx.payload.get("key", ""), "three")

    def four(self, ctx):
        return work(ctx.payload.get("key", ""), "four")
