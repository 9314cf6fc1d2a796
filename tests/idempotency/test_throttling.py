"""The answers the middleware gives itself (replays, 409, 422, a missing or malformed key's 400)
count against throttles (idempotency.throttling): a DRF view's own, or IDEMPOTENCY
["THROTTLE_RATE"] for other views. They bypassed every throttle: 300 replays in 2.7 s, no 429."""

import pytest
from rest_framework.test import APIClient

from idempotency.models import IdempotencyRecord

pytestmark = pytest.mark.django_db

JOB = {"domain": "scan", "payload": {}}


def jobs_rate(settings, rate):
    rates = {**settings.REST_FRAMEWORK.get("DEFAULT_THROTTLE_RATES", {}), "jobs": rate}
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}


def post_job(client, key, payload=None):
    body = {**JOB, "payload": payload or {}}
    return client.post("/api/jobs/", data=body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def assert_429(response) -> dict:
    assert response.status_code == 429, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert int(response["Retry-After"]) > 0
    return response.json()


def test_replays_of_a_drf_view_pass_its_throttles(api_client, settings, other_user):
    jobs_rate(settings, "4/min")
    assert post_job(api_client, "r1").status_code == 201  # counted by the view
    for _ in range(3):
        replay = post_job(api_client, "r1")
        assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert assert_429(post_job(api_client, "r1"))["status"] == 429  # the view's own 429
    other = APIClient()
    other.force_authenticate(other_user)
    assert post_job(other, "r1").status_code == 201  # per user


def test_key_mismatches_and_missing_keys_of_a_drf_view_pass_its_throttles(api_client, settings):
    jobs_rate(settings, "3/min")
    assert post_job(api_client, "m1").status_code == 201
    assert post_job(api_client, "m1", {"other": 1}).status_code == 422
    assert api_client.post("/api/jobs/", data=JOB, format="json").status_code == 400  # no key
    assert_429(post_job(api_client, "m1", {"other": 2}))
    assert_429(api_client.post("/api/jobs/", data=JOB, format="json"))
    assert IdempotencyRecord.objects.count() == 1


@pytest.mark.urls("tests.idempotency.urls")
def test_replays_of_a_plain_view_pass_the_layers_rate_per_principal(client_for, user, other_user, settings):
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "THROTTLE_RATE": "3/min"}
    client = client_for(user)

    def send(key, body=b"{}"):
        return client.post("/t/plain/", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)

    assert send("p1").status_code == 201  # the view's run: not one of the layer's own answers
    for _ in range(2):
        assert send("p1")["Idempotent-Replayed"] == "true"
    assert send("p1", b'{"other": 1}').status_code == 422
    body = assert_429(send("p1"))
    assert body["type"] == "urn:problem:idempotency-throttled"
    assert_429(send("p1", b'{"other": 1}'))
    assert send("p2").status_code == 201  # a new key runs the view: not throttled here
    other = client_for(other_user).post(
        "/t/plain/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="p1"
    )
    assert other.status_code == 201  # per principal


@pytest.mark.urls("tests.idempotency.urls")
def test_without_a_rate_plain_views_replay_unthrottled(client_for, user):
    client = client_for(user)
    for _ in range(20):
        response = client.post("/t/plain/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="u1")
        assert response.status_code == 201


@pytest.mark.urls("tests.idempotency.urls")
def test_authentication_comes_first(client, settings, user):
    """An anonymous request gets no idempotency, so no count of the layer's: its view answers."""
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "THROTTLE_RATE": "1/min"}
    for _ in range(3):
        response = client.post("/t/plain/", b"{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="a1")
        assert response.status_code != 429
