"""A delayed task (run_after) on real processes: kept with its job in the database, not in the
broker, it is not started before it is due, and it survives a restart of the worker, of the
sweeper (`sweep_jobs`, which sends it once due) and of Redis (append-only file), then runs once.

The processes run on a Redis of the test's own, which it SIGKILLs and starts again from its
append-only file."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.redis_server import RedisServer
from eventbus.djangotasks.compat import TaskResultStatus
from eventbus.models import Job
from tests.eventbus.helpers import broker_down
from tests.processes import Manage, wait_for
from tests.tasks import tasks

from .conftest import celery_worker, read_lines, wait_for_state

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# Long enough for a pass of the sweeper to be seen before it is due (a second or two).
DELAY = timedelta(seconds=8)


def start_all(*processes):
    """Start them side by side (a worker takes seconds to import everything)."""
    for process in processes:
        process.start(wait=False)
    for process in processes:
        wait_for(process.ready, timeout=60, interval=0.1, message=f"{process.name} to start")


def test_a_delayed_task_waits_and_survives_restarts_of_every_process_and_redis(tmp_path, redis_url):
    path = str(tmp_path / "lines")
    server = RedisServer(data_dir=tmp_path / "redis", durable=True, args=("--appendfsync", "always")).start()
    env = {"REDIS_URL": server.url}
    worker = celery_worker("tasks-delayed", **env)
    sweeper = Manage("sweep_jobs", "--interval", "1", "--older-than", "0", **env)
    sweeper.ready_text = "Sweeping every"
    try:
        start_all(worker, sweeper)
        delayed = tasks.append_line.using(run_after=timezone.now() + DELAY).enqueue(path, "delayed")
        # Due at once, and not sent by this process (its broker is away): the sweeper sends it, in
        # a pass that finds the delayed one not due.
        with broker_down():
            marker = tasks.append_line.using(run_after=timezone.now()).enqueue(path, "marker")
        wait_for_state(marker.id, Job.State.COMPLETED, worker, sweeper)

        job = Job.objects.get(pk=delayed.id)
        assert (job.state, job.enqueued_at, job.started_at) == (Job.State.PENDING, None, None)
        assert tasks.append_line.get_result(delayed.id).status == TaskResultStatus.READY
        assert read_lines(path) == ["marker"] and worker.received(delayed.id) == 0

        for process in (worker, sweeper):
            process.stop()
        server.kill()
        server.start()
        start_all(worker, sweeper)

        job = wait_for_state(delayed.id, Job.State.COMPLETED, worker, sweeper)
        assert read_lines(path) == ["marker", "delayed"]
        assert worker.received(delayed.id) == 1  # both lives of the worker: one log
        # Sent, and started, once due: the database's own times say so.
        assert job.run_after <= job.enqueued_at <= job.started_at
        assert tasks.append_line.get_result(delayed.id).status == TaskResultStatus.SUCCESSFUL
    finally:
        for process in (worker, sweeper):
            process.stop()
            process.log_path.unlink(missing_ok=True)
        server.stop()
