"""Priorities order the ready tasks of a queue: tasks of priority -100, 0 and 100 sent while no
worker runs are started, by one worker running one task at a time, highest first.

kombu's Redis transport keeps a queue's messages in one list per priority band (four by default:
0, 3, 6, 9, the lowest first) and a worker empties the first band before it reads the next;
eventbus.tasks.broker_priority puts 100 in band 0, 0 in band 3 and -100 in band 9."""

import pytest

from eventbus.models import Job
from tests.eventbus.helpers import queued_task_ids
from tests.tasks import tasks

from .conftest import read_lines, wait_for_state

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

PRIORITIES = (-100, 0, 100)


def test_a_busy_worker_starts_the_highest_priority_first(start_worker, broker, tmp_path):
    path = str(tmp_path / "lines")
    results = [
        tasks.append_line.using(priority=priority).enqueue(path, f"{priority}:{i}")
        for i in range(3)
        for priority in PRIORITIES  # sent lowest first: in the order sent, -100 would run first
    ]
    assert len(queued_task_ids(broker)) == 9 and read_lines(path) == []

    worker = start_worker("tasks-priority")  # concurrency 1, prefetch multiplier 1 (the settings)
    for result in results:
        wait_for_state(result.id, Job.State.COMPLETED, worker)
    assert read_lines(path) == [f"{priority}:{i}" for priority in reversed(PRIORITIES) for i in range(3)]
