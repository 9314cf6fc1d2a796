"""The demo's POST /demo/tasks/ (config.views) without a worker: what it enqueues, keyed by the
request's Idempotency-Key, and what it refuses."""

from datetime import timedelta

import pytest
from django.utils import timezone

from eventbus.models import Job
from idempotency.models import IdempotencyRecord

pytestmark = pytest.mark.django_db

PATH = "/demo/tasks/"


def post(client, body, key="visit-1"):
    return client.post(PATH, data=body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_post_enqueues_the_task_as_the_users_job(api_client, user):
    response = post(api_client, {"n": 3})
    assert response.status_code == 201
    job = Job.objects.get()
    assert response.json() == {"task_id": str(job.id)}
    assert job.domain == "task" and job.owner == user and job.state == Job.State.PENDING
    assert job.payload["task"] == "config.tasks.record_visit" and job.payload["args"] == [3]
    assert job.idem_key == "visit-1:1" and job.run_after is None  # keyed from the request's key


def test_a_retry_of_the_key_answers_the_same_task(api_client):
    first = post(api_client, {"n": 2})
    again = post(api_client, {"n": 2})
    assert again.status_code == 201 and again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert Job.objects.count() == 1


def test_the_view_run_again_for_the_key_enqueues_nothing_new(api_client):
    """As after a crash between the enqueue's commit and the stored answer: no record, so the
    view runs again, and its enqueue finds the task its key made."""
    first = post(api_client, {"n": 2})
    IdempotencyRecord.objects.all().delete()
    again = post(api_client, {"n": 2})
    assert again.status_code == 201 and again.get("Idempotent-Replayed") is None
    assert again.json() == first.json()
    assert Job.objects.count() == 1


def test_a_delay_starts_the_task_that_much_later(api_client):
    before = timezone.now()
    response = post(api_client, {"n": 1, "delay": 2.5})
    after = timezone.now()
    job = Job.objects.get(pk=response.json()["task_id"])
    assert before + timedelta(seconds=2.5) <= job.run_after <= after + timedelta(seconds=2.5)
    assert job.state == Job.State.PENDING and job.enqueued_at is None  # the sweeper sends it when due


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"n": 0},
        {"n": 101},
        {"n": "3"},
        {"n": 2.5},
        {"n": True},
        {"n": 1, "delay": -1},
        {"n": 1, "delay": 61},
        {"n": 1, "delay": "5"},
        {"n": 1, "delay": False},
        [1],
    ],
)
def test_bad_input_is_a_400_problem_and_enqueues_nothing(api_client, body):
    response = post(api_client, body)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["errors"]
    assert not Job.objects.exists()
    # Refused: the key is free for a corrected request.
    assert post(api_client, {"n": 1}).status_code == 201


def test_a_key_and_a_user_are_required(api_client, client):
    missing = api_client.post(PATH, data={"n": 1}, format="json")
    assert missing.status_code == 400 and missing["Content-Type"] == "application/problem+json"
    anonymous = client.post(PATH, data={"n": 1}, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k")
    assert anonymous.status_code in (401, 403)
    assert not Job.objects.exists()
