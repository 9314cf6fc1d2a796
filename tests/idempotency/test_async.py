"""The middleware under ASGI (django.test.AsyncClient): the same answers as under WSGI, from
its async path."""

import pytest
from asgiref.sync import iscoroutinefunction, sync_to_async
from django.test import AsyncClient

from idempotency.middleware import IdempotencyMiddleware
from idempotency.models import IdempotencyRecord

from . import views
from .test_concurrency import StalledRequest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.idempotency.urls")]


async def post(client, path, key, body="{}"):
    return await client.post(
        path, data=body, content_type="application/json", headers={"Idempotency-Key": key}
    )


@pytest.fixture
async def client(user):
    client = AsyncClient()
    await client.aforce_login(user)
    return client


def test_the_middleware_runs_async_under_an_async_handler():
    async def get_response(request):
        return None

    middleware = IdempotencyMiddleware(get_response)
    assert iscoroutinefunction(middleware) and iscoroutinefunction(middleware.process_view)
    assert not iscoroutinefunction(IdempotencyMiddleware(lambda request: None))


@pytest.mark.parametrize("path", ["/t/plain/", "/t/atomic/"])
async def test_miss_then_replay(client, path):
    first = await post(client, path, "a1")
    assert first.status_code == 201 and not first.has_header("Idempotent-Replayed")
    again = await post(client, path, "a1")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert sum(views.CALLS.values()) == 1


async def test_another_body_is_422(client):
    assert (await post(client, "/t/plain/", "m1")).status_code == 201
    other = await post(client, "/t/plain/", "m1", body='{"other": 1}')
    assert other.status_code == 422 and other.json()["type"] == "urn:problem:idempotency-key-mismatch"
    assert views.CALLS["plain"] == 1


@pytest.mark.parametrize(
    ("path", "counter"),
    [
        ("/t/gated/?gate=g", "gated"),
        pytest.param(
            "/t/atomic/?gate=g",
            "atomic",
            marks=pytest.mark.postgres,  # SQLite's one write lock makes the second request wait, not 409
        ),
    ],
)
async def test_in_flight_is_409(client, user, path, counter):
    stalled = await sync_to_async(StalledRequest)(user, path, "busy", counter)
    busy = await post(client, path, "busy")
    assert busy.status_code == 409 and int(busy["Retry-After"]) >= 1
    assert (await sync_to_async(stalled.release)()).status_code == 201
    assert views.CALLS[counter] == 1
    assert await IdempotencyRecord.objects.filter(key="busy", state="COMPLETED").aexists()


async def test_an_uncovered_request_passes_through(client):
    response = await client.post(
        "/t/exempt/", data="{}", content_type="application/json", headers={"Idempotency-Key": "x"}
    )
    assert response.status_code == 201
    assert not await IdempotencyRecord.objects.aexists()
