"""run_scheduler as real processes: two at once over a schedule of every second enqueue each tick
once, and a Celery worker runs each tick's task once.

The schedulers read their schedule from the settings (tests.tasks.scheduler_settings, the JSON of
TEST_TASK_SCHEDULES); the worker runs on the test settings. Nothing here depends on how fast a tick
is enqueued or run: the assertions are on what the database, the logs and the task's file hold.
"""

import json
import re
from collections import Counter
from datetime import datetime, timedelta

import pytest

from eventbus.models import Job
from tests.processes import Manage, Worker, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SCOPE = "schedule:eventbus:default"
TICKS = 8  # enqueued before the schedulers are stopped
ENQUEUED = re.compile(r"Schedule 'beat': tick (\S+) enqueued \(task ([0-9a-f-]+)\)")


def scheduler(lines_path) -> Manage:
    schedules = {
        "beat": {"task": "tests.tasks.tasks.append_line", "every": 1, "args": [str(lines_path), "tick"]},
    }
    process = Manage(
        "run_scheduler",
        DJANGO_SETTINGS_MODULE="tests.tasks.scheduler_settings",
        TEST_TASK_SCHEDULES=json.dumps(schedules),
    )
    process.ready_text = "Scheduling 1 schedule(s) (default:beat)"
    return process


def beat_jobs():
    return list(Job.objects.filter(scope=SCOPE).order_by("idem_key"))


def test_two_schedulers_enqueue_each_tick_once_and_a_worker_runs_each_once(redis_client, tmp_path):
    lines = tmp_path / "ticks.txt"
    worker = Worker("scheduled-w", concurrency=2)
    schedulers = [scheduler(lines), scheduler(lines)]
    processes = [worker, *schedulers]
    try:
        worker.start()
        for process in schedulers:
            process.start(timeout=60)
        wait_for(
            lambda: len(beat_jobs()) >= TICKS, timeout=120, interval=0.2, message=f"{TICKS} ticks enqueued"
        )
        for process in schedulers:
            process.stop(timeout=30)
            assert process.process.returncode == 0, process.log()
        jobs = beat_jobs()

        # One job per tick's key, and no tick left out between the first and the last (each
        # scheduler enqueues every tick that comes due while it runs).
        keys = Counter(job.idem_key for job in jobs)
        assert set(keys.values()) == {1}, keys
        ticks = [datetime.fromisoformat(key.removeprefix("beat:")) for key in keys]
        assert len(ticks) >= TICKS
        assert ticks == [ticks[0] + timedelta(seconds=i) for i in range(len(ticks))], ticks

        # Each tick enqueued by one scheduler: what each logged it created, and says it did at its
        # exit, adds up to the jobs, with no tick claimed by both.
        created = [dict(ENQUEUED.findall(process.log())) for process in schedulers]
        assert not set(created[0]) & set(created[1]), created
        by_tick = {**created[0], **created[1]}
        assert by_tick == {job.idem_key.removeprefix("beat:"): str(job.id) for job in jobs}
        said = [
            int(re.search(r"Enqueued (\d+) tick\(s\)\.", process.log()).group(1)) for process in schedulers
        ]
        assert said == [len(created[0]), len(created[1])]

        # Each tick's task ran, once: as many lines as ticks, every job completed.
        wait_for(
            lambda: all(job.state == Job.State.COMPLETED for job in beat_jobs()),
            timeout=120,
            interval=0.2,
            message=f"every tick's task run:\n{worker.log(tail=3000)}",
        )
        assert lines.read_text().splitlines() == ["tick"] * len(jobs)
    finally:
        for process in processes:
            process.stop()
            process.log_path.unlink(missing_ok=True)
