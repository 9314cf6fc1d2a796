"""GET /api/jobs/ (the user's jobs: filters, pages, ownership) and the detail's stages (docs/reference/http-api.md)."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from eventbus.models import Job, StageRecord

pytestmark = pytest.mark.django_db

ITEM_KEYS = {
    "job_id",
    "domain",
    "state",
    "ws_url",
    "accepted_at",
    "run_after",
    "completed_at",
    "retry_of",
    "retried_by",
    "parent",
}


def make_job(owner, key, *, domain="scan", state="PENDING", minutes_ago=0, **fields):
    return Job.objects.create(
        scope=f"-:{owner.pk}",
        idem_key=key,
        owner=owner,
        domain=domain,
        event_type="job.requested",
        state=state,
        payload={"secret": key},
        accepted_at=timezone.now() - timedelta(minutes=minutes_ago),
        **fields,
    )


def client_of(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


def ids(response):
    return [item["job_id"] for item in response.json()["results"]]


def assert_problem(response, status):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["title"] and body["type"]
    return body


def test_the_list_holds_the_users_own_jobs_newest_first(api_client, user, other_user):
    old = make_job(user, "old", minutes_ago=10)
    new = make_job(user, "new", domain="chat", state="COMPLETED", completed_at=timezone.now())
    middle = make_job(user, "middle", minutes_ago=5)
    theirs = make_job(other_user, "theirs")
    response = api_client.get("/api/jobs/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == 3 and body["next"] is None and body["previous"] is None
    assert ids(response) == [str(new.id), str(middle.id), str(old.id)]
    assert str(theirs.id) not in ids(response)
    first = body["results"][0]
    assert set(first) == ITEM_KEYS  # no payload in the list
    assert first["domain"] == "chat" and first["state"] == "COMPLETED" and first["retry_of"] is None
    assert first["ws_url"] == f"ws://testserver/ws/jobs/{new.id}/"
    assert first["accepted_at"].endswith("Z") and first["completed_at"].endswith("Z")
    assert body["results"][1]["completed_at"] is None


def test_the_view_permission_lists_every_users_jobs(user, other_user, django_user_model):
    make_job(user, "a")
    make_job(other_user, "b")
    auditor = django_user_model.objects.create_user("auditor", password="x")
    auditor.user_permissions.add(Permission.objects.get(codename="view_job"))
    assert client_of(auditor).get("/api/jobs/").json()["count"] == 2
    staff = django_user_model.objects.create_user("ops", password="x", is_staff=True)
    assert client_of(staff).get("/api/jobs/").json()["count"] == 0


def test_filters_by_state_and_domain(api_client, user, other_user):
    failed_scan = make_job(user, "1", state="FAILED")
    failed_chat = make_job(user, "2", domain="chat", state="FAILED", minutes_ago=1)
    running_chat = make_job(user, "3", domain="chat", state="RUNNING", minutes_ago=2)
    make_job(other_user, "4", state="FAILED")
    assert ids(api_client.get("/api/jobs/?state=FAILED")) == [str(failed_scan.id), str(failed_chat.id)]
    assert ids(api_client.get("/api/jobs/?domain=chat")) == [str(failed_chat.id), str(running_chat.id)]
    assert ids(api_client.get("/api/jobs/?domain=chat&state=RUNNING")) == [str(running_chat.id)]
    assert len(ids(api_client.get("/api/jobs/?state=&domain="))) == 3  # empty: no filter
    assert api_client.get("/api/jobs/?state=TIMED_OUT").json() == {
        "count": 0,
        "next": None,
        "previous": None,
        "results": [],
    }


@pytest.mark.parametrize(
    "query, field",
    [
        ("state=DONE", "state"),
        ("state=failed", "state"),
        ("domain=nope", "domain"),
        ("domain=sc%00an", "domain"),
        ("state=%00", "state"),
        ("page=0", "page"),
        ("page=-1", "page"),
        ("page=abc", "page"),
        ("page=1.5", "page"),
        ("page_size=0", "page_size"),
        ("page_size=101", "page_size"),
        ("page_size=ten", "page_size"),
        ("page_size=" + "9" * 5000, "page_size"),
    ],
)
def test_a_bad_filter_or_page_is_a_400_problem(api_client, user, query, field):
    make_job(user, "a")
    body = assert_problem(api_client.get(f"/api/jobs/?{query}"), 400)
    assert field in body["errors"], body


def test_pages_as_drf_pages_them(api_client, user, settings):
    jobs = [make_job(user, f"k{i}", minutes_ago=i) for i in range(25)]  # jobs[0] is the newest
    first = api_client.get("/api/jobs/").json()
    assert first["count"] == 25 and len(first["results"]) == 20  # GATEWAY["JOBS_PAGE_SIZE"]
    assert first["previous"] is None and first["next"] == "http://testserver/api/jobs/?page=2"
    second = api_client.get("/api/jobs/?page=2")
    assert ids(second) == [str(job.id) for job in jobs[20:]]
    assert second.json()["next"] is None and second.json()["previous"] == "http://testserver/api/jobs/"
    assert ids(api_client.get("/api/jobs/?page=last")) == ids(second)
    sized = api_client.get("/api/jobs/?page_size=10&page=3").json()
    assert [r["job_id"] for r in sized["results"]] == [str(job.id) for job in jobs[20:]]
    assert len(api_client.get("/api/jobs/?page_size=100").json()["results"]) == 25
    settings.GATEWAY = {"JOBS_PAGE_SIZE": 7}
    assert len(api_client.get("/api/jobs/").json()["results"]) == 7


@pytest.mark.parametrize("page", ["4", "9" * 30])
def test_a_page_past_the_end_is_a_404_problem(api_client, user, page):
    make_job(user, "a")
    assert_problem(api_client.get(f"/api/jobs/?page={page}"), 404)


def test_the_list_needs_a_user(client):
    assert_problem(client.get("/api/jobs/"), 401)


# -- the detail's stages ------------------------------------------------------------------------


def record(job, stage, **fields):
    return StageRecord.objects.create(job=job, stage=stage, **fields)


def test_the_detail_shows_every_declared_stage_with_its_record(api_client, user):
    job = make_job(user, "staged", domain="staged", state="RUNNING")
    started = timezone.now() - timedelta(seconds=30)
    record(job, "first", attempts=1, started_at=started, finished_at=started + timedelta(seconds=1))
    record(
        job,
        "second",
        attempts=2,
        started_at=started,
        error_type="ValueError",
        error_message="card declined",
        failed_at=started + timedelta(seconds=2),
    )
    response = api_client.get(f"/api/jobs/{job.id}/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["retry_of"] is None and body["payload"] == {"secret": "staged"}
    stages = body["stages"]
    assert [(s["name"], s["label"], s["state"], s["attempts"]) for s in stages] == [
        ("first", "First", "COMPLETED", 1),
        ("second", "Second", "FAILED", 2),
        ("third", "Third", "PENDING", 0),
    ]
    assert stages[0]["started_at"].endswith("Z") and stages[0]["finished_at"].endswith("Z")
    assert stages[0]["error"] is None
    assert stages[1]["finished_at"] is None
    assert stages[1]["error"] == {"type": "ValueError", "message": "card declined"}
    assert stages[2] == {
        "name": "third",
        "label": "Third",
        "state": "PENDING",
        "attempts": 0,
        "started_at": None,
        "finished_at": None,
        "error": None,
        "waiting_for": None,
    }
    # A stage started and neither finished nor failed is running.
    record(job, "third", attempts=1)
    assert api_client.get(f"/api/jobs/{job.id}/").json()["stages"][2]["state"] == "RUNNING"


def test_the_stages_are_read_in_one_query_whatever_their_number(api_client, user):
    def queries_for(job) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            assert api_client.get(f"/api/jobs/{job.id}/").status_code == 200
        return [query["sql"] for query in queries.captured_queries]

    bare = make_job(user, "bare", domain="staged", state="RUNNING")
    full = make_job(user, "full", domain="staged", state="RUNNING")
    for stage in ("first", "second", "third"):
        record(full, stage, attempts=1)
    queries_for(bare)  # the user's permissions are read once, then cached on it
    full_queries = queries_for(full)
    assert len(full_queries) == len(queries_for(bare))
    assert len([sql for sql in full_queries if "eventbus_stagerecord" in sql]) == 1


def test_a_job_whose_type_is_gone_shows_the_stages_it_ran(api_client, user):
    job = make_job(user, "gone", domain="retired", state="COMPLETED")
    now = timezone.now()
    record(job, "later", attempts=1, started_at=now, finished_at=now)
    record(job, "earlier", attempts=1, started_at=now - timedelta(seconds=5), finished_at=now)
    stages = api_client.get(f"/api/jobs/{job.id}/").json()["stages"]
    assert [(s["name"], s["state"]) for s in stages] == [("earlier", "COMPLETED"), ("later", "COMPLETED")]


def test_another_users_job_is_404_on_the_detail(user, other_user):
    job = make_job(user, "mine", domain="staged")
    assert_problem(client_of(other_user).get(f"/api/jobs/{job.id}/"), 404)


def test_a_page_costs_the_same_queries_whatever_its_length(api_client, user):
    def queries_for(query) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert api_client.get(f"/api/jobs/{query}").status_code == 200
        return len(queries.captured_queries)

    make_job(user, "first")
    queries_for("")  # the user's permissions are read once, then cached on it
    one = queries_for("")
    for i in range(30):
        make_job(user, f"more-{i}")
    assert queries_for("?page_size=100") == one == queries_for("?page=2")
