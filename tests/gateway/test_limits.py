"""Limits on the jobs API (docs/howto/deploy.md, Limits): the per-user cap on running jobs and the "jobs" throttle,
each a 429 problem with Retry-After that stores nothing under the request's key."""

import json

import pytest
from rest_framework.test import APIClient

from eventbus.exceptions import JobLimitReached
from eventbus.job.limits import check_running_cap
from eventbus.models import Job
from idempotency.models import IdempotencyRecord

pytestmark = pytest.mark.django_db


def create(client, key):
    return client.post(
        "/api/jobs/", data={"domain": "scan", "payload": {}}, format="json", HTTP_IDEMPOTENCY_KEY=key
    )


def assert_429(response):
    assert response.status_code == 429, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == 429 and body["title"] and body["detail"] and body["type"]
    assert int(response["Retry-After"]) > 0
    return body


def client_of(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_one_job_over_the_cap_is_a_429_and_its_key_stays_free(api_client, settings, other_user):
    settings.EVENTBUS = {
        **settings.EVENTBUS,
        "MAX_RUNNING_JOBS_PER_USER": 2,
        "MAX_RUNNING_JOBS_RETRY_AFTER": 7,
    }
    assert create(api_client, "k1").status_code == 201
    assert create(api_client, "k2").status_code == 201
    refused = create(api_client, "k3")
    assert assert_429(refused)["type"] == "urn:problem:job-limit-reached"
    assert refused["Retry-After"] == "7"
    assert Job.objects.count() == 2
    assert not IdempotencyRecord.objects.filter(key="k3").exists()  # 429: never stored
    assert create(api_client, "k1").status_code == 201  # a replay is no new job: never refused
    assert create(client_of(other_user), "k3").status_code == 201  # the cap is per user

    Job.objects.filter(idem_key="k1").update(state=Job.State.COMPLETED)
    again = create(api_client, "k3")
    assert again.status_code == 201, again.content
    assert "Idempotent-Replayed" not in again


def test_check_running_cap_counts_the_owners_pending_and_running_jobs(user, other_user, settings):
    def job(owner, key, state):
        Job.objects.create(
            scope="s", idem_key=key, owner=owner, domain="scan", event_type="job.requested", state=state
        )

    settings.EVENTBUS = {**settings.EVENTBUS, "MAX_RUNNING_JOBS_PER_USER": 2}
    job(user, "p", "PENDING")
    for state in ("COMPLETED", "FAILED", "TIMED_OUT"):
        job(user, state, state)
    job(other_user, "o1", "RUNNING")
    job(other_user, "o2", "RUNNING")
    check_running_cap(user)  # one running: under the cap
    check_running_cap(None)  # no owner: no cap
    with pytest.raises(JobLimitReached) as raised:
        check_running_cap(other_user)
    assert raised.value.retry_after == 30  # the documented default
    job(user, "r", "RUNNING")
    with pytest.raises(JobLimitReached):
        check_running_cap(user)
    settings.EVENTBUS = {**settings.EVENTBUS, "MAX_RUNNING_JOBS_PER_USER": None}
    check_running_cap(user)


def throttle_rate(settings, rate):
    rates = {**settings.REST_FRAMEWORK.get("DEFAULT_THROTTLE_RATES", {}), "jobs": rate}
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}


def test_the_jobs_throttle_answers_429_with_retry_after(api_client, settings, other_user):
    throttle_rate(settings, "3/min")
    assert api_client.get("/api/jobs/").status_code == 200
    assert create(api_client, "t1").status_code == 201
    job_id = Job.objects.get().id
    assert api_client.get(f"/api/jobs/{job_id}/").status_code == 200
    assert_429(api_client.get("/api/jobs/"))
    assert_429(api_client.get(f"/api/jobs/{job_id}/"))
    assert_429(create(api_client, "t2"))
    assert not IdempotencyRecord.objects.filter(key="t2").exists()  # throttled: nothing stored
    assert client_of(other_user).get("/api/jobs/").status_code == 200  # per user


def test_a_project_without_a_jobs_rate_gets_the_default_one_not_a_500(api_client, settings):
    settings.REST_FRAMEWORK = {
        key: value for key, value in settings.REST_FRAMEWORK.items() if key != "DEFAULT_THROTTLE_RATES"
    }
    for _ in range(5):
        assert api_client.get("/api/jobs/").status_code == 200
    throttle_rate(settings, None)  # None: not throttled
    assert api_client.get("/api/jobs/").status_code == 200


def test_the_throttle_counts_in_the_cache_as_json_never_pickle(api_client, settings, redis_client):
    """The demo's cache (config.settings.base.redis_cache) serializes with JSON: what DRF's
    throttle writes there reads back as JSON, and a forged pickle would not be unpickled."""
    from config.settings.base import redis_cache

    assert redis_cache("redis://127.0.0.1:6379/0", "p")["OPTIONS"]["SERIALIZER"] == (
        "django_redis.serializers.json.JSONSerializer"
    )
    assert redis_cache("redis+sentinel://127.0.0.1:26379/mymaster/0", "p")["OPTIONS"]["SERIALIZER"] == (
        "django_redis.serializers.json.JSONSerializer"
    )
    throttle_rate(settings, "100/min")
    api_client.get("/api/jobs/")
    api_client.get("/api/jobs/")
    [key] = redis_client.keys("*throttle_jobs_*")
    history = json.loads(redis_client.get(key))
    assert len(history) == 2 and all(isinstance(at, float) for at in history)


@pytest.mark.parametrize("rates", [{"jobs": "3/min"}, {"other": "3/min"}], ids=["jobs-rate", "no-jobs-rate"])
def test_a_projects_own_scoped_throttle_neither_counts_twice_nor_fails(
    api_client, settings, monkeypatch, rates
):
    """A project whose DEFAULT_THROTTLE_CLASSES hold DRF's ScopedRateThrottle (the views' class
    attribute, read by DRF at import): it would see the jobs views' scope too, counting each
    request twice under the same cache key, or failing every request (ImproperlyConfigured)
    without a "jobs" rate. The jobs throttle takes its place on these views."""
    from rest_framework.throttling import ScopedRateThrottle

    from gateway.api import JobListView

    monkeypatch.setattr(JobListView, "throttle_classes", [ScopedRateThrottle])
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}
    for _ in range(3):
        assert api_client.get("/api/jobs/").status_code == 200
    if "jobs" in rates:
        assert_429(api_client.get("/api/jobs/"))


def test_the_throttle_lets_requests_through_while_the_cache_is_down(api_client, settings, free_tcp_port):
    """The throttle counts in the cache: with the cache's Redis down (nothing listens on its
    port) the jobs API still answers, unthrottled, as the idempotency layer falls back to the
    database; not a 500 (found by the chaos run, which kills Redis)."""
    from config.settings.base import redis_cache

    settings.CACHES = {"default": redis_cache(f"redis://127.0.0.1:{free_tcp_port}/0", "down")}
    throttle_rate(settings, "1/min")
    assert api_client.get("/api/jobs/").status_code == 200
    assert api_client.get("/api/jobs/").status_code == 200
    created = create(api_client, "while-down")
    assert created.status_code == 201, created.content
    assert api_client.get(f"/api/jobs/{created.json()['job_id']}/").status_code == 200
