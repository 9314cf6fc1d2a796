"""A task whose worker is SIGKILLed mid-run: kombu's Redis transport keeps its unacknowledged
message and a second worker gets it once it is older than the visibility timeout; the dead run's
lease expires (EVENTBUS["RUN_LEASE_SECONDS"]) and the second run completes the task, once."""

import pytest

from eventbus.djangotasks.compat import TaskResultStatus
from eventbus.djangotasks.names import RUN_STAGE
from eventbus.djangotasks.taskjob import TaskJob
from eventbus.jobtypes import FINAL_STAGE
from eventbus.models import Job
from tests.eventbus.helpers import job_events, queued_task_ids
from tests.processes import wait_for
from tests.tasks import tasks

from .conftest import read_lines, wait_for_state

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# Short: the killed worker's message comes back that soon (the task is held only while the test
# kills its worker, so no live run outlasts it).
VISIBILITY_TIMEOUT = 3


def test_a_task_whose_worker_was_killed_completes_once_on_another_worker(start_worker, broker, tmp_path):
    path, gate = str(tmp_path / "lines"), tmp_path / "gate"
    first = start_worker("tasks-killed", visibility_timeout=VISIBILITY_TIMEOUT)
    held = tasks.hold.enqueue(path, str(gate))
    wait_for(
        lambda: read_lines(path) == ["start"],
        timeout=30,
        message=f"the task started:\n{first.log(tail=3000)}",
    )
    [first_pool] = first.pool_pids()
    first.kill()
    # Nobody acked or requeued it: the message waits in kombu's unacked hash.
    assert broker.hlen("unacked") == 1 and queued_task_ids(broker) == []
    assert Job.objects.get(pk=held.id).state == Job.State.RUNNING
    gate.touch()

    second = start_worker("tasks-rescuer", visibility_timeout=VISIBILITY_TIMEOUT)
    wait_for_state(held.id, Job.State.COMPLETED, first, second)
    assert read_lines(path) == ["start", "start", "done"]  # the body twice, completed once
    result = tasks.hold.get_result(held.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "done"
    assert result.attempts == 2 and len(set(result.worker_ids)) == 2, result.worker_ids
    [second_pool] = second.pool_pids()
    assert [worker.rsplit(":", 1)[1] for worker in result.worker_ids] == [str(first_pool), str(second_pool)]
    assert second.received(held.id) >= 1
    # Each event once in the job's stream: the second run's copy of the first report was dropped.
    [run] = TaskJob.plan()
    assert job_events(broker, "task", held.id) == [
        (RUN_STAGE, run.seq(0)),
        (RUN_STAGE, run.seq(1)),
        (FINAL_STAGE, TaskJob.final_seq()),
    ]
