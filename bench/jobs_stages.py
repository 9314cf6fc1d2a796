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

Database writes are counted the same way in every process of the three systems: each INSERT,
UPDATE or DELETE statement appends its table's name to BENCH_JOBS_WRITE_LOG. Django's
connections get an execute wrapper (`WriteCounting`, an app of bench/jobs_settings.py), and
SQLAlchemy's engines (DBOS's, in its workers and its client) an event listener.
"""

from __future__ import annotations

import os
import re
import time

from django.apps import AppConfig
from django.db.backends.signals import connection_created

from eventbus.jobtypes import JobType, Stage

STAGES = ("one", "two", "three", "four")
SEQS = (10, 20, 30, 40)
FINAL_SEQ = 51
EXPECTED_SEQS = (*SEQS, FINAL_SEQ)
DOMAIN = "benchjob"  # ours: the job type's name, its domain
DBOS_WORKFLOW = "bench_job"  # DBOS: the workflow's registered name
DBOS_QUEUE = "bench-jobs"
DBOS_STREAM = "progress"

_log_fds: dict[str, tuple[int, int]] = {}  # variable -> (pid, fd): a forked pool process opens its own


def _log(variable: str, line: str) -> None:
    path = os.environ.get(variable)
    if not path:
        return
    opened = _log_fds.get(variable)
    if opened is None or opened[0] != os.getpid():
        opened = _log_fds[variable] = (
            os.getpid(),
            os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600),
        )
    os.write(opened[1], line.encode())


def work(key: str, stage: str) -> dict:
    """One stage's work, in every system: logged, the same small sleep (if any), a small result."""
    _log("BENCH_JOBS_EXEC_LOG", f"{key} {stage}\n")
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


# --- database writes, counted ---------------------------------------------------------------------

_TABLE = r'(?:"?\w+"?\.)?"?(\w+)"?'
WRITE = re.compile(r"^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+" + _TABLE, re.IGNORECASE)
# A statement that starts with WITH writes when a CTE, or the statement after them, does (never a
# SELECT ... FOR UPDATE: the writing verb must follow a parenthesis).
CTE_WRITE = re.compile(r"[()]\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+" + _TABLE, re.IGNORECASE)


def count_write(sql: str) -> None:
    """One write statement, logged under the first table it writes."""
    head = sql.lstrip()[:4].upper()
    if head[:1] in ("I", "U", "D"):
        found = WRITE.match(sql)
    elif head == "WITH":
        found = CTE_WRITE.search(sql)
    else:
        return
    if found:
        _log("BENCH_JOBS_WRITE_LOG", found.group(1) + "\n")


def _django_wrapper(execute, sql, params, many, context):
    count_write(sql)
    return execute(sql, params, many, context)


def _on_connection(sender, connection, **kwargs) -> None:
    if _django_wrapper not in connection.execute_wrappers:
        connection.execute_wrappers.append(_django_wrapper)


def _before_cursor_execute(conn, cursor, statement, parameters, context, executemany) -> None:
    count_write(statement)


def count_sqlalchemy_writes() -> None:
    """Every SQLAlchemy engine of the process (DBOS's) counts its writes."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "before_cursor_execute", _before_cursor_execute):
        event.listen(Engine, "before_cursor_execute", _before_cursor_execute)


class WriteCounting(AppConfig):
    """In INSTALLED_APPS of bench/jobs_settings.py: the process's writes counted, when
    BENCH_JOBS_WRITE_LOG names the log."""

    name = "bench"
    label = "bench_jobs_writes"

    def ready(self) -> None:
        if os.environ.get("BENCH_JOBS_WRITE_LOG"):
            connection_created.connect(_on_connection, dispatch_uid="bench.jobs_stages.count_writes")
            try:
                count_sqlalchemy_writes()
            except ImportError:
                pass
