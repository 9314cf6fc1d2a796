"""A request whose PostgreSQL backend is killed (pg_terminate_backend) while it runs: a 503
problem with Retry-After, never a 500, and the retry with the same key executes once."""

import time

import pytest
from django.test import Client

from eventbus.models import Job
from idempotency.models import IdempotencyRecord
from idempotency.stores.db import DatabaseStore
from tests.postgres import kill_own_backend

from . import views

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.idempotency.urls"),
    pytest.mark.postgres,  # kills a PostgreSQL backend (pg_terminate_backend); SQLite has no server to lose
]


def post(client, path, key):
    return client.post(path, data="{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.fixture
def client(user):
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def retried(client, path, key, timeout=10.0):
    """Send the request again, honouring 409 and 503 with their Retry-After, as a client should."""
    deadline = time.monotonic() + timeout
    while True:
        response = post(client, path, key)
        if response.status_code not in (409, 503) or time.monotonic() > deadline:
            return response
        time.sleep(min(float(response["Retry-After"]), 0.2))


def assert_database_unavailable(response):
    assert response.status_code == 503
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["type"] == "urn:problem:idempotency-database-unavailable"
    assert int(response["Retry-After"]) >= 1


def test_backend_killed_in_an_atomic_view_rolls_back_and_the_retry_runs_once(client):
    views.KILLS.add("k")
    assert_database_unavailable(post(client, "/t/atomic/?kill=k", "killed"))
    assert views.CALLS["atomic"] == 1
    assert not Job.objects.filter(event_type="effect").exists()  # died with its transaction
    assert not IdempotencyRecord.objects.filter(key="killed", state="COMPLETED").exists()

    retry = retried(client, "/t/atomic/?kill=k", "killed")
    assert retry.status_code == 201, retry.content
    assert views.CALLS["atomic"] == 2
    assert Job.objects.filter(event_type="effect").count() == 1
    replay = post(client, "/t/atomic/?kill=k", "killed")
    assert replay["Idempotent-Replayed"] == "true" and replay.content == retry.content
    assert Job.objects.filter(event_type="effect").count() == 1


@pytest.mark.parametrize("taking", ["claim", "acquire"])
def test_backend_killed_while_the_key_is_taken(client, monkeypatch, request, taking):
    """claim: the key held by the view's transaction; acquire: by a durable lease."""
    if taking == "acquire":
        request.getfixturevalue("durable_leases")
    take = getattr(DatabaseStore, taking)

    def take_then_lose_the_backend(self, **kwargs):
        kill_own_backend()
        return take(self, **kwargs)

    monkeypatch.setattr(DatabaseStore, taking, take_then_lose_the_backend)
    assert_database_unavailable(post(client, "/t/atomic/", "early"))
    assert views.CALLS["atomic"] == 0
    monkeypatch.setattr(DatabaseStore, taking, take)
    assert retried(client, "/t/atomic/", "early").status_code == 201
    assert views.CALLS["atomic"] == 1


def test_the_next_request_gets_a_new_connection(client):
    views.KILLS.add("k")
    assert_database_unavailable(post(client, "/t/atomic/?kill=k", "first"))
    assert post(client, "/t/atomic/", "second").status_code == 201
