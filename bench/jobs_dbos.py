"""The jobs benchmark's baseline (b), DBOS Transact: the workflow and its worker process.

    python -m bench.jobs_dbos    # one worker process; bench/jobs.py starts --workers of them

The deployment of DBOS's own "queue worker" example: worker processes launch DBOS and execute
the workflows of a queue; the web tier (a Django view and a Channels consumer in
bench/jobs_baselines.py) only enqueues them and reads their streams through a `DBOSClient`.

The workflow runs the four stages of bench/jobs_stages.py, each a `@DBOS.step()` (its result
checkpointed), and after each one writes the stage's frame to the workflow's stream
(`DBOS.write_stream`); then the final frame, and closes the stream. The workflow's id is the job's
Idempotency-Key (scoped by user): enqueued again under the same id, DBOS attaches to the workflow
it has instead of running another.

Environment (set by bench/jobs.py): BENCH_DBOS_URL (the system database), BENCH_DBOS_EXECUTOR
(this process's executor id: each process its own, as DBOS asks of several processes),
BENCH_DBOS_POLLING (the queue's polling interval, seconds), BENCH_DBOS_WORKER_CONCURRENCY
(workflows one process runs at once; unset, no limit), BENCH_DBOS_POOL (its connection pool).
"""

from __future__ import annotations

import os
import signal
import threading

from dbos import DBOS, DBOSConfig

from bench.jobs_stages import (
    DBOS_QUEUE,
    DBOS_STREAM,
    DBOS_WORKFLOW,
    STAGES,
    count_sqlalchemy_writes,
    final_frame,
    progress_frame,
    work,
)

APP_NAME = "bench-jobs"


@DBOS.step(name="bench_stage")
def stage_step(key: str, stage: str) -> dict:
    return work(key, stage)


@DBOS.workflow(name=DBOS_WORKFLOW)
def bench_job(key: str, payload: dict) -> dict:
    job_id = DBOS.workflow_id or key
    results = {}
    for index, stage in enumerate(STAGES):
        results[stage] = stage_step(key, stage)
        DBOS.write_stream(DBOS_STREAM, progress_frame(job_id, index))
    DBOS.write_stream(DBOS_STREAM, final_frame(job_id))
    DBOS.close_stream(DBOS_STREAM)
    return results


def config() -> DBOSConfig:
    return {
        "name": APP_NAME,
        "system_database_url": os.environ["BENCH_DBOS_URL"],
        "executor_id": os.environ.get("BENCH_DBOS_EXECUTOR", "local"),
        "sys_db_pool_size": int(os.environ.get("BENCH_DBOS_POOL", 10)),
        "log_level": "WARNING",
        # Its processes are paused (SIGSTOP) while another system is measured: no session of
        # theirs may be ended for sitting idle in a transaction meanwhile.
        "sys_db_idle_transaction_timeout_sec": 0,
    }


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    count_sqlalchemy_writes()
    DBOS(config=config())
    DBOS.launch()
    concurrency = os.environ.get("BENCH_DBOS_WORKER_CONCURRENCY")
    DBOS.register_queue(
        DBOS_QUEUE,
        polling_interval_sec=float(os.environ.get("BENCH_DBOS_POLLING", 1.0)),
        worker_concurrency=int(concurrency) if concurrency else None,
        on_conflict="always_update",
    )
    print("dbos worker ready", flush=True)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=5)


if __name__ == "__main__":
    main()
