"""The backend's enqueue and results without a worker: what is written, keyed and refused."""

import pytest
from django.db import transaction

from eventbus.djangotasks.compat import TaskResultDoesNotExist, TaskResultStatus
from eventbus.models import Job
from tests.tasks import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_enqueue_makes_a_ready_task_job():
    result = tasks.add.enqueue(1, 2)
    job = Job.objects.get(pk=result.id)
    assert job.domain == "task" and job.state == Job.State.PENDING
    assert job.payload["task"] == "tests.tasks.tasks.add" and job.payload["args"] == [1, 2]
    assert result.status == TaskResultStatus.READY and result.args == [1, 2]
    again = tasks.add.get_result(result.id)
    assert again.id == result.id and again.status == TaskResultStatus.READY


def test_rolled_back_enqueue_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        raise RuntimeError
    assert not Job.objects.filter(pk=result.id).exists()
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result.id)
