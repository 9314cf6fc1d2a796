"""Durable stages in the jobs API (docs/reference/http-api.md): POST /api/jobs/<id>/signals/<name>/
(once per Idempotency-Key, the owner's or the change permission's, each refusal a problem), a
delayed start (`run_after`) in POST /api/jobs/, and what the detail and the list say of a job's
waits, signals, parent and children. Last, the demo's approval job run in process: its review
waits for either of two signals, which the API sends, and its atomic stage writes its ledger line
once."""

import json
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework.test import APIClient

from config.models import LedgerEntry
from eventbus.job import runs
from eventbus.job.waits import take_signal
from eventbus.models import Job, JobSignal, StageRecord
from eventbus.services import signal_job
from idempotency.models import IdempotencyRecord
from tests.eventbus.helpers import point_broker

pytestmark = pytest.mark.django_db


def make_job(owner, key="approval-1", *, domain="approval", state="PENDING", **fields):
    return Job.objects.create(
        scope=f"-:{owner.pk}",
        idem_key=key,
        owner=owner,
        domain=domain,
        event_type="job.requested",
        state=state,
        payload={"amount": 5},
        **fields,
    )


def client_of(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


def signal(client, job, name="approve", *, key="signal-1", body=None, raw=None):
    """POST the signal; `body` as JSON (None: no body at all), or `raw` text as it is."""
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    data = raw if raw is not None else ("" if body is None else json.dumps(body))
    return client.post(
        f"/api/jobs/{job.id}/signals/{name}/", data=data, content_type="application/json", **headers
    )


def assert_problem(response, status, problem_type=None):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["title"] and body["detail"] is not None
    if problem_type is not None:
        assert body["type"] == problem_type, body
    return body


@pytest.fixture
def broker(redis_client, redis_url):
    """The Celery app of this process sends to the test Redis (a woken job's run goes there)."""
    point_broker(redis_url)
    return redis_client


def staff(django_user_model, name, *codenames):
    user = django_user_model.objects.create_user(name, password="x", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


# -- POST /api/jobs/<id>/signals/<name>/ ----------------------------------------------------------


def test_the_owner_signals_a_job_and_the_same_key_replays_the_answer(api_client, user):
    job = make_job(user)
    sent = signal(api_client, job, body={"by": "ann"})
    assert sent.status_code == 202, sent.content
    body = sent.json()
    assert set(body) == {"job_id", "signal", "sent_at", "delivered"}
    assert (body["job_id"], body["signal"], body["delivered"]) == (str(job.id), "approve", False)
    stored = JobSignal.objects.get(job=job)
    assert (stored.name, stored.payload, stored.idem_key, stored.sent_by) == (
        "approve",
        {"by": "ann"},
        "signal-1",
        user,
    )
    assert parse_datetime(body["sent_at"]) == stored.sent_at

    again = signal(api_client, job, body={"by": "ann"})
    assert again.status_code == 202 and again.content == sent.content
    assert again["Idempotent-Replayed"] == "true"
    assert JobSignal.objects.count() == 1


def test_the_same_key_after_its_stored_answer_is_gone_is_the_same_signal(api_client, user):
    job = make_job(user)
    first = signal(api_client, job, body={"by": "ann"}).json()
    IdempotencyRecord.objects.all().delete()  # the key's stored answer expired
    cache.clear()
    again = signal(api_client, job, body={"by": "ann"})
    assert again.status_code == 202 and not again.has_header("Idempotent-Replayed")
    assert again.json() == first  # signal_job's own replay: the signal sent first
    assert JobSignal.objects.count() == 1


def test_an_empty_body_is_an_empty_payload(api_client, user):
    job = make_job(user)
    assert signal(api_client, job, "reject").status_code == 202
    assert JobSignal.objects.get(job=job).payload == {}


def test_another_key_for_a_signal_sent_already_is_409(api_client, user):
    job = make_job(user)
    assert signal(api_client, job, key="first").status_code == 202
    problem = assert_problem(signal(api_client, job, key="second"), 409, "urn:problem:signal-sent")
    assert problem["signal"] == "approve"
    # Another name is another signal.
    assert signal(api_client, job, "reject", key="third").status_code == 202
    assert JobSignal.objects.filter(job=job).count() == 2


def test_an_unknown_signal_is_400_naming_those_the_job_takes(api_client, user):
    job = make_job(user)
    problem = assert_problem(signal(api_client, job, "escalate"), 400, "urn:problem:unknown-signal")
    assert problem["signals"] == ["approve", "reject"]
    scan = make_job(user, "scan-1", domain="scan")
    assert assert_problem(signal(api_client, scan, "approve"), 400)["signals"] == []
    assert not JobSignal.objects.exists()
    # A 400 stores nothing under the key: the corrected request goes through with it.
    assert signal(api_client, job, "approve").status_code == 202


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED", "CANCELLED"])
def test_an_ended_job_is_409(api_client, user, state):
    job = make_job(user, state=state)
    problem = assert_problem(signal(api_client, job), 409, "urn:problem:job-ended")
    assert state in problem["detail"]
    assert not JobSignal.objects.exists()


def test_no_key_is_400(api_client, user):
    job = make_job(user)
    assert_problem(signal(api_client, job, key=None, body={}), 400)
    assert not JobSignal.objects.exists()


@pytest.mark.parametrize(
    "raw", ["{nope", "[1, 2]", '"approve"', "null", '{"note": "a\\u0000b"}', "[" * 5000 + "]" * 5000]
)
def test_a_body_that_is_not_a_storable_json_object_is_400(api_client, user, raw):
    job = make_job(user)
    assert_problem(signal(api_client, job, raw=raw, key=f"bad-{uuid.uuid4()}"), 400)
    assert not JobSignal.objects.exists()


def test_a_payload_over_the_size_limit_is_400(api_client, user, settings):
    settings.EVENTBUS = {**settings.EVENTBUS, "MAX_PAYLOAD_BYTES": 1000}
    job = make_job(user)
    problem = assert_problem(signal(api_client, job, body={"note": "x" * 1000}), 400)
    assert "the limit is 1000 bytes" in str(problem["errors"]["payload"])
    assert not JobSignal.objects.exists()
    assert signal(api_client, job, body={"note": "short"}).status_code == 202  # the key was free again


def test_another_users_job_is_404_and_a_viewer_may_not_signal(user, other_user, django_user_model):
    job = make_job(user)
    assert_problem(signal(client_of(other_user), job), 404)
    assert_problem(signal(client_of(other_user), Job(id=uuid.uuid4()), key="no-such-job"), 404)
    assert_problem(signal(client_of(staff(django_user_model, "ops")), job), 404)  # is_staff alone: nothing
    viewer = staff(django_user_model, "auditor", "view_job")
    assert_problem(signal(client_of(viewer), job), 403)  # sees it, may not act on it
    assert not JobSignal.objects.exists()


def test_staff_with_the_change_permission_signal_another_users_job(user, django_user_model):
    job = make_job(user)
    operator = staff(django_user_model, "operator", "view_job", "change_job")
    sent = signal(client_of(operator), job, "reject", body={"by": "operator"})
    assert sent.status_code == 202, sent.content
    assert JobSignal.objects.get(job=job).sent_by == operator


def test_anonymous_is_401(client, user):
    job = make_job(user)
    assert signal(client, job).status_code == 401
    assert not JobSignal.objects.exists()


# -- run_after in POST /api/jobs/ -----------------------------------------------------------------


def start(client, key, **fields):
    return client.post(
        "/api/jobs/", {"domain": "scan", "payload": {}, **fields}, format="json", HTTP_IDEMPOTENCY_KEY=key
    )


def test_run_after_as_seconds_or_an_aware_time_delays_the_start(api_client):
    before = timezone.now()
    in_a_minute = start(api_client, "later", run_after=60)
    assert in_a_minute.status_code == 201, in_a_minute.content
    job = Job.objects.get(pk=in_a_minute.json()["job_id"])
    assert job.state == "PENDING"
    assert before + timedelta(seconds=60) <= job.run_after <= timezone.now() + timedelta(seconds=60)

    at = (timezone.now() + timedelta(days=2)).replace(microsecond=0)
    at_text = at.astimezone(timezone.get_fixed_timezone(120)).isoformat()  # +02:00: the same instant
    timed = start(api_client, "at", run_after=at_text)
    assert timed.status_code == 201, timed.content
    assert Job.objects.get(pk=timed.json()["job_id"]).run_after == at
    detail = api_client.get(f"/api/jobs/{timed.json()['job_id']}/").json()
    assert parse_datetime(detail["run_after"]) == at

    zero = start(api_client, "now", run_after=0.0)
    assert zero.status_code == 201
    assert Job.objects.get(pk=zero.json()["job_id"]).run_after <= timezone.now()
    plain = start(api_client, "plain")
    assert Job.objects.get(pk=plain.json()["job_id"]).run_after is None


@pytest.mark.parametrize(
    "run_after",
    [
        -1,
        31 * 86400 + 1,
        float("inf"),
        True,
        "tomorrow",
        "2030-01-01T09:00:00",  # no offset: no instant
        "2030-02-30T09:00:00Z",
        "0001-01-01T00:00:00+14:00",  # before the first instant a datetime holds
        timedelta(days=32),  # as a time that far ahead
        [60],
        {"seconds": 60},
        None,
    ],
    ids=repr,
)
def test_a_bad_run_after_is_400_and_the_key_is_free_again(api_client, run_after):
    if isinstance(run_after, timedelta):
        run_after = (timezone.now() + run_after).isoformat()
    body = {"domain": "scan", "payload": {}, "run_after": run_after}
    text = json.dumps(body) if run_after != float("inf") else json.dumps(body).replace("Infinity", "1e999")
    refused = api_client.post(
        "/api/jobs/", data=text, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k"
    )
    problem = assert_problem(refused, 400)
    assert "run_after" in problem["errors"], problem
    assert not Job.objects.exists()
    assert start(api_client, "k", run_after=5).status_code == 201


# -- what the detail and the list say -------------------------------------------------------------


def test_the_detail_says_what_a_waiting_job_waits_for_its_signals_and_its_children(api_client, user):
    parent = make_job(user, state="WAITING", run_after=timezone.now() + timedelta(hours=1))
    now = timezone.now()
    StageRecord.objects.create(job=parent, stage="request", attempts=1, started_at=now, finished_at=now)
    StageRecord.objects.create(
        job=parent, stage="review", attempts=1, started_at=now, waiting_for="signal:approve,reject"
    )
    children = [
        make_job(
            user,
            f"child-{n}",
            domain="scan",
            state=state,
            parent=parent,
            accepted_at=now + timedelta(seconds=n),
        )
        for n, state in enumerate(["COMPLETED", "RUNNING"])
    ]
    detail = api_client.get(f"/api/jobs/{parent.id}/").json()
    assert detail["state"] == "WAITING" and detail["parent"] is None
    assert detail["waiting_for"] == "signal:approve,reject"
    assert detail["signals"] == ["approve", "reject"]
    assert detail["children"] == [
        {"job_id": str(children[0].id), "domain": "scan", "state": "COMPLETED"},
        {"job_id": str(children[1].id), "domain": "scan", "state": "RUNNING"},
    ]
    assert [(s["name"], s["state"], s["waiting_for"]) for s in detail["stages"]] == [
        ("request", "COMPLETED", None),
        ("review", "WAITING", "signal:approve,reject"),
        ("record", "PENDING", None),
    ]
    child = api_client.get(f"/api/jobs/{children[0].id}/").json()
    assert child["parent"] == str(parent.id) and child["children"] == [] and child["signals"] == []
    assert child["waiting_for"] is None

    listed = {item["job_id"]: item for item in api_client.get("/api/jobs/").json()["results"]}
    assert listed[str(parent.id)]["parent"] is None
    assert {listed[str(c.id)]["parent"] for c in children} == {str(parent.id)}

    # Cancelled, it waits no more.
    Job.objects.filter(pk=parent.pk).update(state="CANCELLED")
    assert api_client.get(f"/api/jobs/{parent.id}/").json()["waiting_for"] is None


def test_children_cost_the_detail_one_query_and_the_list_none(api_client, user):
    def queries(path) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert api_client.get(path).status_code == 200
        return len(captured.captured_queries)

    lone = make_job(user, "lone")
    parent = make_job(user, "parent")
    queries(f"/api/jobs/{lone.id}/")  # the user's permissions are read once, then cached
    alone = queries(f"/api/jobs/{lone.id}/")
    for n in range(5):
        make_job(user, f"child-{n}", domain="scan", parent=parent)
    assert queries(f"/api/jobs/{parent.id}/") == alone
    few = queries("/api/jobs/?page_size=3")
    assert queries("/api/jobs/?page_size=7") == few


# -- the demo's approval job, in process ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_approval_waits_for_either_signal_and_records_its_decision_once(api_client, broker, user):
    def run(job_id) -> str:
        return runs.run(str(job_id), fail_on_transient=False)

    def started(key, amount):
        answer = api_client.post(
            "/api/jobs/",
            {"domain": "approval", "payload": {"amount": amount}},
            format="json",
            HTTP_IDEMPOTENCY_KEY=key,
        )
        assert answer.status_code == 201, answer.content
        return answer.json()["job_id"]

    approved, rejected = started("a-1", 250), started("a-2", 70)
    for job_id in (approved, rejected):
        assert run(job_id) == "waiting"
        detail = api_client.get(f"/api/jobs/{job_id}/").json()
        assert detail["state"] == "WAITING" and detail["waiting_for"] == "signal:approve,reject"
        # The review's timeout is when it resumes at the latest.
        assert parse_datetime(detail["run_after"]) > timezone.now() + timedelta(hours=23)

    assert signal(api_client, Job(id=approved), "approve", key="yes", body={"by": "ann"}).status_code == 202
    # Sent after it, before the run takes either: the first one sent is the decision.
    assert signal(api_client, Job(id=approved), "reject", key="no").status_code == 202
    assert run(approved) == "COMPLETED"
    assert signal(api_client, Job(id=rejected), "reject", key="no-2").status_code == 202
    assert run(rejected) == "COMPLETED"

    assert list(LedgerEntry.objects.filter(job_id=approved).values_list("amount", flat=True)) == [250]
    assert list(LedgerEntry.objects.filter(job_id=rejected).values_list("amount", flat=True)) == [0]
    review = StageRecord.objects.get(job_id=approved, stage="review")
    assert review.result == {"decision": "approved", "by": "ann"} and review.attempts == 1
    assert StageRecord.objects.get(job_id=rejected, stage="review").result == {
        "decision": "rejected",
        "by": None,
    }
    assert JobSignal.objects.get(job_id=approved, name="approve").delivered_at is not None
    assert JobSignal.objects.get(job_id=approved, name="reject").delivered_at is None
    # Ended, the job takes no new signal; its detail says so, and its decision.
    assert_problem(signal(api_client, Job(id=rejected), "approve", key="late"), 409, "urn:problem:job-ended")
    detail = api_client.get(f"/api/jobs/{approved}/").json()
    assert detail["state"] == "COMPLETED" and detail["waiting_for"] is None
    assert [s["state"] for s in detail["stages"]] == ["COMPLETED"] * 3


@pytest.mark.django_db(transaction=True)
def test_a_wait_for_two_signals_takes_the_first_sent_on_every_attempt(broker, user):
    """Both sent before the review waits: the first sent is the decision, and a re-run of the
    stage (its worker lost after the wait) takes that one again, not the other."""
    job = make_job(user)
    signal_job(job.id, "reject", {"by": "bob"}, key="r")
    signal_job(job.id, "approve", {"by": "ann"}, key="a")
    assert runs.run(str(job.id), fail_on_transient=False) == "COMPLETED"
    review = StageRecord.objects.get(job=job, stage="review")
    assert review.result == {"decision": "rejected", "by": "bob"}
    JobSignal.objects.filter(job=job, name="reject").update(sent_at=timezone.now())  # now the later one
    assert take_signal(job.id, "approve", "reject").name == "reject", "the one delivered before"
