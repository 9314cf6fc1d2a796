"""The backend's enqueue and results without a worker: what is written, keyed and refused."""

import uuid
from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

import eventbus
from eventbus.djangotasks.compat import InvalidTask, TaskResultDoesNotExist, TaskResultStatus, task_backends
from eventbus.djangotasks.taskjob import TaskJob
from eventbus.jobtypes import registry
from eventbus.models import Job
from eventbus.services import start_job
from idempotency.exceptions import IdempotencyKeyMismatch
from idempotency.models import IdempotencyRecord
from tests.tasks import tasks, views

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


# -- what is refused ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"priority": 101},
        {"priority": -101},
        {"queue_name": "nope"},
        {"run_after": datetime(2030, 1, 1, 12, 0)},  # naive, with USE_TZ
    ],
    ids=["priority-above", "priority-below", "unknown-queue", "naive-run-after"],
)
def test_a_task_the_backend_refuses_is_invalid_and_writes_nothing(options):
    with pytest.raises(InvalidTask):
        tasks.add.using(**options).enqueue(1, 2)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "args", [(object(), 1), (float("nan"), 1), ({1, 2}, 1)], ids=["object", "nan", "set"]
)
def test_arguments_that_are_not_json_are_a_type_error(args):
    with pytest.raises(TypeError, match="must be JSON"):
        tasks.add.enqueue(*args)
    assert not Job.objects.exists()


def test_a_model_instance_as_an_argument_is_a_type_error(user):
    with pytest.raises(TypeError, match="must be JSON"):
        tasks.add.enqueue(user, 1)
    assert not Job.objects.exists()


def test_tuples_are_stored_and_given_back_as_lists():
    result = tasks.add.enqueue((1, 2), b=((3,), "x"))
    job = Job.objects.get(pk=result.id)
    assert (job.payload["args"], job.payload["kwargs"]) == ([[1, 2]], {"b": [[3], "x"]})
    assert (result.args, result.kwargs) == ([[1, 2]], {"b": [[3], "x"]})
    again = tasks.add.get_result(result.id)
    assert (again.args, again.kwargs) == ([[1, 2]], {"b": [[3], "x"]})


def test_queue_priority_and_run_after_are_kept_with_the_job():
    later = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(queue_name="reports", priority=-100, run_after=later).enqueue(1, 2)
    job = Job.objects.get(pk=result.id)
    assert (job.queue, job.priority, job.run_after) == ("reports", -100, later)
    assert (job.state, job.enqueued_at) == (Job.State.PENDING, None)
    again = tasks.add.get_result(result.id)
    assert (again.task.queue_name, again.task.priority, again.task.run_after) == ("reports", -100, later)
    assert Job.objects.get(pk=tasks.add.enqueue(1, 2).id).queue == ""  # default: Celery's default queue


# -- results ------------------------------------------------------------------------------------


@pytest.mark.parametrize("result_id", ["nope", "", None, 42, "00000000-0000-4000-8000-000000000000"])
def test_get_result_of_an_id_that_is_no_task_is_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result_id)


def test_get_result_of_another_jobs_id_is_does_not_exist(user):
    job, _ = start_job("scan", {}, key="scan-1", owner=user)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(str(job.id))


async def test_aenqueue_and_aget_result():
    result = await tasks.add.aenqueue(4, 5)
    assert result.status == TaskResultStatus.READY
    again = await tasks.add.aget_result(result.id)
    assert (again.id, again.status, again.args) == (result.id, TaskResultStatus.READY, [4, 5])
    with pytest.raises(TaskResultDoesNotExist):
        await tasks.add.aget_result(str(uuid.uuid4()))


# -- keys ---------------------------------------------------------------------------------------


def test_a_keyed_enqueue_without_a_worker_is_one_job_and_another_payload_is_a_mismatch():
    with eventbus.enqueue_key("nightly"):
        first = tasks.add.enqueue(1, 2)
        second = tasks.add.enqueue(3, 4)  # the block's second enqueue: a key of its own
    with eventbus.enqueue_key("nightly"):
        assert tasks.add.enqueue(1, 2).id == first.id
        assert tasks.add.enqueue(3, 4).id == second.id
    assert first.id != second.id and Job.objects.count() == 2
    with pytest.raises(IdempotencyKeyMismatch), eventbus.enqueue_key("nightly"):
        tasks.add.enqueue(1, 3)
    assert Job.objects.count() == 2


@pytest.mark.urls("tests.tasks.urls")
def test_a_keyed_view_retried_enqueues_no_new_task_and_the_tasks_are_the_users(api_client, user):
    views.CALLS.clear()

    def post():
        return api_client.post("/t/enqueue-two/", {}, format="json", HTTP_IDEMPOTENCY_KEY="view-1")

    first = post()
    assert first.status_code == 201, first.content
    ids = first.json()["tasks"]
    jobs = Job.objects.filter(pk__in=ids)
    assert len(jobs) == 2 and {job.owner for job in jobs} == {user}
    assert {job.domain for job in jobs} == {"task"}

    replay = post()  # the stored answer: the view is not run
    assert replay["Idempotent-Replayed"] == "true" and replay.json() == first.json()
    assert views.CALLS["enqueue-two"] == 1

    # As after a crash between the enqueues' commit and the stored answer: the view runs again,
    # and each enqueue finds the task its key made.
    IdempotencyRecord.objects.all().delete()
    again = post()
    assert again.status_code == 201 and again.get("Idempotent-Replayed") is None
    assert views.CALLS["enqueue-two"] == 2
    assert again.json() == first.json() and Job.objects.count() == 2


# -- the jobs API -------------------------------------------------------------------------------


def test_the_task_job_type_is_registered_but_not_startable_by_the_jobs_api(api_client):
    assert registry()["task"] is TaskJob
    payload = {
        "task": "tests.tasks.tasks.add",
        "args": [1, 2],
        "kwargs": {},
        "queue_name": "default",
        "backend": "default",
        "takes_context": False,
    }
    response = api_client.post(
        "/api/jobs/", {"domain": "task", "payload": payload}, format="json", HTTP_IDEMPOTENCY_KEY="api-task"
    )
    assert response.status_code == 400, response.content
    [refusal] = response.json()["errors"]["domain"]
    assert refusal.startswith("Not a job type") and "'task'" not in refusal
    assert not Job.objects.exists()
