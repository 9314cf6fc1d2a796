"""A keyed request is authenticated before its body is fingerprinted (docs/howto/idempotent-views.md, Replays and authentication): an
unauthenticated client cannot make the server hash a large body just by adding a key. The view
refuses it as it would without a key, and nothing is stored.

Counted, not timed: a spy on the function that hashes bodies."""

import json

import pytest
from django.test import AsyncClient, Client
from rest_framework.test import APIClient

from idempotency import fingerprint, middleware
from idempotency.models import IdempotencyRecord

from . import views

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.idempotency.urls")]
BODY = json.dumps({"blob": "x" * 200_000, "nested": [{"a": i} for i in range(2000)]})


@pytest.fixture
def hashed(monkeypatch):
    """How many request bodies were fingerprinted."""
    calls = []
    real = fingerprint.body_digest

    def spy(request):
        calls.append(request.path)
        return real(request)

    monkeypatch.setattr(fingerprint, "body_digest", spy)
    monkeypatch.setattr(middleware, "body_digest", spy, raising=False)
    return calls


def keyed_post(client, path, key="anon-1", **extra):
    return client.post(path, BODY, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key, **extra)


@pytest.mark.parametrize("path", ["/t/drf/", "/t/drf-func/", "/t/items/"])
@pytest.mark.parametrize("credentials", [{}, {"HTTP_AUTHORIZATION": "Token not-a-token"}])
def test_an_unauthenticated_keyed_request_is_refused_without_hashing_its_body(hashed, path, credentials):
    response = keyed_post(Client(), path, **credentials)
    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["status"] == 401
    assert hashed == []
    assert not IdempotencyRecord.objects.exists()


def test_an_anonymous_request_to_a_view_that_allows_it_runs_without_idempotency(hashed):
    """A plain Django view that lets anonymous users in: no scope, so no key handling at all."""
    for _ in range(2):
        assert keyed_post(Client(), "/t/plain/").status_code == 201
    assert views.CALLS["plain"] == 2
    assert hashed == []
    assert not IdempotencyRecord.objects.exists()


def test_an_authenticated_keyed_request_is_hashed_once(hashed, user):
    """The control: the spy sees the body of a request that is authenticated."""
    client = APIClient()
    client.force_login(user)
    first = keyed_post(client, "/t/drf/", key="auth-1")
    assert first.status_code == 201
    assert hashed == ["/t/drf/"]
    assert IdempotencyRecord.objects.filter(key="auth-1", state="COMPLETED").exists()


@pytest.mark.django_db(transaction=True)
async def test_under_asgi_too(hashed):
    response = await AsyncClient().post(
        "/t/drf/", BODY, content_type="application/json", headers={"Idempotency-Key": "anon-asgi"}
    )
    assert response.status_code == 401
    assert hashed == []
