"""The jobs API contract of docs/reference/http-api.md."""

import json
import uuid

import pytest
from django.test import Client

from eventbus.models import Job

pytestmark = pytest.mark.django_db


def create(client, key="job-1", body=None):
    return client.post(
        "/api/jobs/",
        data=body or {"domain": "scan", "payload": {"n": 1}},
        format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )


def test_post_creates_a_job(api_client):
    response = create(api_client)
    assert response.status_code == 201
    body = response.json()
    job = Job.objects.get()
    assert body == {
        "job_id": str(job.id),
        "domain": "scan",
        "state": "PENDING",
        "ws_url": f"ws://testserver/ws/jobs/{job.id}/",
    }
    assert job.idem_key == "job-1" and job.payload == {"n": 1}


def test_post_without_key_is_400_problem(api_client):
    response = api_client.post("/api/jobs/", {"domain": "scan"}, format="json")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert not Job.objects.exists()


def test_invalid_body_is_400_problem_and_the_key_can_be_retried(api_client):
    bad = create(api_client, key="j", body={"domain": "nope"})
    assert bad.status_code == 400
    assert bad["Content-Type"] == "application/problem+json"
    assert "domain" in bad.json()["errors"]
    malformed = api_client.post(
        "/api/jobs/", data="{nope", content_type="application/json", HTTP_IDEMPOTENCY_KEY="j2"
    )
    assert malformed.status_code == 400 and malformed.json()["status"] == 400


def test_replay_same_status_body_and_no_second_job(api_client):
    first = create(api_client)
    again = create(api_client)
    assert again.status_code == 201 and again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert Job.objects.count() == 1


def test_get_own_job_and_404_for_others(api_client, other_user, user):
    job_id = create(api_client).json()["job_id"]
    mine = api_client.get(f"/api/jobs/{job_id}/")
    assert mine.status_code == 200 and mine.json()["job_id"] == job_id and "latest_event" in mine.json()
    stranger = Client()
    stranger.force_login(other_user)
    theirs = stranger.get(f"/api/jobs/{job_id}/")
    assert theirs.status_code == 404 and theirs["Content-Type"] == "application/problem+json"
    assert stranger.get(f"/api/jobs/{uuid.uuid4()}/").status_code == 404
    assert stranger.get("/api/jobs/not-a-uuid/").status_code == 404


def logged_in(user):
    client = Client()
    client.force_login(user)
    return client


def test_staff_alone_opens_no_other_users_job(api_client, django_user_model):
    job_id = create(api_client).json()["job_id"]
    staff = django_user_model.objects.create_user("ops", password="x", is_staff=True)
    response = logged_in(staff).get(f"/api/jobs/{job_id}/")
    assert response.status_code == 404 and response["Content-Type"] == "application/problem+json"
    assert "payload" not in response.json()


def test_the_view_permission_opens_every_job_staff_or_not(api_client, django_user_model):
    from django.contrib.auth.models import Permission

    job_id = create(api_client).json()["job_id"]
    viewer = django_user_model.objects.create_user("auditor", password="x")  # not staff
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    response = logged_in(viewer).get(f"/api/jobs/{job_id}/")
    assert response.status_code == 200 and response.json()["payload"] == {"n": 1}
    root = django_user_model.objects.create_superuser("root", password="x")
    assert logged_in(root).get(f"/api/jobs/{job_id}/").status_code == 200
    assert api_client.get(f"/api/jobs/{job_id}/").status_code == 200  # the owner, always


def test_anonymous_is_401(client):
    assert client.get(f"/api/jobs/{uuid.uuid4()}/").status_code == 401
    assert client.post("/api/jobs/", {}, content_type="application/json").status_code == 401


def test_get_shows_the_latest_event(api_client, redis_client):
    from eventbus import publish_event

    job_id = create(api_client).json()["job_id"]
    assert api_client.get(f"/api/jobs/{job_id}/").json()["latest_event"] is None
    publish_event("scan", job_id, "vision", 10, {"progress": 20})
    publish_event("scan", job_id, "rule", 20, {"progress": 40})
    latest = api_client.get(f"/api/jobs/{job_id}/").json()["latest_event"]
    assert latest["seq"] == 20 and latest["stage"] == "rule" and latest["data"] == {"progress": 40}


@pytest.mark.parametrize("corrupt", [b"not json", b"[" * 100_000 + b"]" * 100_000])
def test_a_state_key_that_is_not_json_gives_no_latest_event_not_a_500(api_client, redis_client, corrupt):
    from eventbus.bus.keys import JobKeys

    job_id = create(api_client).json()["job_id"]
    redis_client.set(JobKeys("scan", job_id).state, corrupt)  # not the bus's: written by someone else
    response = api_client.get(f"/api/jobs/{job_id}/")
    assert response.status_code == 200 and response.json()["latest_event"] is None


def test_the_demo_users_token_authenticates_the_api(settings, tmp_path):
    """The documented way to a token (docs/reference/http-api.md): `ensure_demo_user --token`
    (what `make run` prints too), or DRF's `drf_create_token demo`; the same token each time,
    and it opens POST /api/jobs/."""
    import io

    from django.core.management import call_command
    from rest_framework.test import APIClient

    settings.RUN_DIR = tmp_path  # not the developer's .run/: the demo password is written there

    def run(*args):
        out = io.StringIO()
        call_command(*args, stdout=out)
        return out.getvalue()

    token = run("ensure_demo_user", "--token").strip()
    assert f"API token: {token}" in run("ensure_demo_user")
    assert run("ensure_demo_user", "--token").strip() == token
    assert f"Generated token {token} for user demo" in run("drf_create_token", "demo")

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    response = create(client, key="readme-demo-1")
    assert response.status_code == 201, response.content
    assert Job.objects.get().owner.username == "demo"
    client.credentials(HTTP_AUTHORIZATION="Token not-the-token")
    assert create(client, key="readme-demo-2").status_code == 401


@pytest.mark.django_db
def test_jobs_need_a_user_whatever_the_projects_drf_defaults(settings, client):
    """A project whose REST_FRAMEWORK allows anybody by default: the jobs API still does not."""
    settings.REST_FRAMEWORK = {"EXCEPTION_HANDLER": "idempotency.problems.drf_exception_handler"}
    response = client.post(
        "/api/jobs/", {"domain": "scan"}, content_type="application/json", HTTP_IDEMPOTENCY_KEY="anon"
    )
    assert response.status_code in (401, 403) and response["Content-Type"] == "application/problem+json"
    assert client.get("/api/jobs/00000000-0000-0000-0000-000000000000/").status_code in (401, 403)


@pytest.mark.django_db
def test_the_page_offers_every_registered_job_type_with_its_stages(client, user):
    import json
    import re

    client.force_login(user)
    page = client.get("/").content.decode()
    declared = json.loads(
        re.search(r'<script id="job-types" type="application/json">(.*?)</script>', page, re.S)[1]
    )
    by_name = {t["name"]: t for t in declared}
    assert {"scan", "chat", "staged"} <= set(by_name)  # staged: the test suite's own job type
    assert by_name["staged"]["stages"] == ["first", "second", "third", "done"]
    assert by_name["chat"]["example_payload"] == {"prompt": "exactly-once delivery"}
    assert '<option value="staged">staged</option>' in page


# Bad payloads: a 400 problem on every database, and the key is free for the corrected request.


def post_raw(client, body: str, key: str):
    return client.post("/api/jobs/", data=body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


def nested(depth: int) -> str:
    """A JSON object `depth` objects deep: {"a":{"a":...{}}}."""
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def assert_problem_400(response):
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == 400 and body["title"] and body["detail"] and body["type"]
    return body


def test_a_body_nested_too_deep_to_parse_is_400_and_the_key_is_free_again(api_client):
    deep = post_raw(api_client, f'{{"domain": "scan", "payload": {nested(5000)}}}', key="deep")
    # The parser refuses it on Python 3.11; 3.12+ parses it and the serializer refuses its depth.
    assert "nested" in str(assert_problem_400(deep))
    assert not Job.objects.exists()
    again = create(api_client, key="deep")
    assert again.status_code == 201, again.content
    assert "Idempotent-Replayed" not in again


def test_a_payload_nested_past_the_limit_is_400_and_the_key_is_free_again(api_client, settings):
    assert (
        create(api_client, key="32", body={"domain": "scan", "payload": json.loads(nested(32))}).status_code
        == 201
    )
    deep = post_raw(api_client, f'{{"domain": "scan", "payload": {nested(33)}}}', key="33")
    assert "32" in str(assert_problem_400(deep)["errors"]["payload"])
    in_a_list = {"domain": "scan", "payload": {"a": [[[1]]]}}
    settings.GATEWAY = {"PAYLOAD_MAX_DEPTH": 3}
    assert_problem_400(create(api_client, key="list", body=in_a_list))
    settings.GATEWAY = {"PAYLOAD_MAX_DEPTH": 4}
    assert create(api_client, key="list", body=in_a_list).status_code == 201
    assert create(api_client, key="33").status_code == 201


@pytest.mark.parametrize(
    "payload",
    [{"a": "nul\u0000here"}, {"nul\u0000key": 1}, {"a": [{"b": ["ok", "\u0000"]}]}],
    ids=["value", "key", "nested"],
)
def test_a_nul_character_in_the_payload_is_400_on_every_database(api_client, payload):
    bad = create(api_client, key="nul", body={"domain": "scan", "payload": payload})
    assert "NUL" in str(assert_problem_400(bad)["errors"]["payload"])
    assert not Job.objects.exists()
    assert create(api_client, key="nul").status_code == 201


def test_a_nul_in_the_domain_is_400(api_client):
    bad = create(api_client, key="nul-domain", body={"domain": "sc\u0000an", "payload": {}})
    assert "domain" in assert_problem_400(bad)["errors"]


def test_a_method_the_view_has_not_is_a_405_whatever_its_key(api_client):
    """PATCH is a keyed method, but the jobs list has no PATCH: the view answers 405, and the key
    neither replays another request's answer (a 422 before) nor keeps the 405 as its own."""
    from idempotency.models import IdempotencyRecord

    assert create(api_client, key="used").status_code == 201
    for key in ("used", "fresh"):
        response = api_client.patch("/api/jobs/", {"domain": "scan"}, format="json", HTTP_IDEMPOTENCY_KEY=key)
        assert response.status_code == 405, response.content
        assert response["Content-Type"] == "application/problem+json"
    assert not IdempotencyRecord.objects.filter(key="fresh").exists()


# What one user may store (eventbus.job.limits) ------------------------------------------------------


def test_a_payload_over_the_size_limit_is_400_naming_it_and_the_key_is_free_again(api_client, settings):
    settings.EVENTBUS = {**settings.EVENTBUS, "MAX_PAYLOAD_BYTES": 1000}
    big = create(api_client, key="big", body={"domain": "scan", "payload": {"image": "x" * 1000}})
    problem = assert_problem_400(big)
    assert "the limit is 1000 bytes" in str(problem["errors"]["payload"])
    assert not Job.objects.exists()
    assert create(api_client, key="big").status_code == 201


def test_jobs_started_past_the_period_cap_are_429_with_retry_after_replays_answer(api_client, settings):
    settings.EVENTBUS = {**settings.EVENTBUS, "MAX_JOBS_CREATED_PER_USER": 2, "JOBS_CREATED_PERIOD": 600}
    assert create(api_client, key="one").status_code == 201
    assert create(api_client, key="two").status_code == 201
    refused = create(api_client, key="three")
    assert refused.status_code == 429 and refused["Content-Type"] == "application/problem+json"
    body = refused.json()
    assert (
        body["type"] == "urn:problem:job-creation-limit-reached" and "at most 2 per 600 s" in body["detail"]
    )
    assert 1 <= int(refused["Retry-After"]) <= 600
    assert create(api_client, key="one").status_code == 201  # a replay
    # A retry is a job started too.
    Job.objects.filter(idem_key="one").update(state=Job.State.FAILED)
    one = Job.objects.get(idem_key="one")
    retry = api_client.post(f"/api/jobs/{one.id}/retry/", HTTP_IDEMPOTENCY_KEY="retry-one")
    assert retry.status_code == 429 and retry["Retry-After"]
    assert Job.objects.count() == 2


def test_a_second_retry_is_a_409_problem_naming_the_first(api_client, user):
    failed = Job.objects.create(
        scope=f"-:{user.pk}",
        idem_key="f",
        domain="scan",
        event_type="job.requested",
        owner=user,
        state="FAILED",
    )
    first = api_client.post(f"/api/jobs/{failed.id}/retry/", HTTP_IDEMPOTENCY_KEY="r-1")
    assert first.status_code == 201
    second = api_client.post(f"/api/jobs/{failed.id}/retry/", HTTP_IDEMPOTENCY_KEY="r-2")
    assert second.status_code == 409 and second["Content-Type"] == "application/problem+json"
    assert second.json()["retried_by"] == first.json()["job_id"]
    assert api_client.get(f"/api/jobs/{failed.id}/").json()["retried_by"] == first.json()["job_id"]
