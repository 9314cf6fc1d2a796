"""A socket whose session ends (logout, password change, deactivation) is closed with 4401 by the
process's session watch (gateway.sessions), through gateway.asgi's entry and channels' stack
alike, with the session in the database or in the cache; a socket whose session is fine stays."""

import json

import pytest
from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.test import Client

from eventbus.models import Job
from gateway.asgi import JobStreamApplication
from gateway.routing import websocket_urlpatterns
from gateway.sessions import ended_sessions, get_session_watch

from .conftest import open_socket, publish_and_route

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("hub_closed")]

CHECK_SECONDS = 0.05  # the interval of the tests: a check is due at once, no test waits for it long


def channels_stack():
    return AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))


@pytest.fixture(autouse=True)
def quick_checks(settings):
    settings.GATEWAY = {"SESSION_CHECK_SECONDS": CHECK_SECONDS}


@pytest.fixture(params=["db", "cache"])
def engine(request, settings):
    """Sessions in the database (read in bulk) or in the cache (the suite's Redis: one load each)."""
    settings.SESSION_ENGINE = f"django.contrib.sessions.backends.{request.param}"
    return request.param


@pytest.fixture(params=[JobStreamApplication, channels_stack], ids=["gateway.asgi", "channels"])
def application(request, engine):
    return request.param()  # built once the engine is set: channels' middleware reads it then


def logged_in(user):
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def alice(user, engine):
    return logged_in(user)


@pytest.fixture
def bob(other_user, engine):
    return logged_in(other_user)


@pytest.fixture
def bobs_job(other_user):
    return Job.objects.create(
        scope="-:2", idem_key="ws-bob", domain="scan", event_type="job.requested", owner=other_user
    )


async def watch(application, job, client):
    socket = await open_socket(
        f"/ws/jobs/{job.id}/",
        client.cookies["sessionid"].value,
        application=application,
        subscribed_to=job,
    )
    assert await socket.receive_nothing(timeout=CHECK_SECONDS * 4)  # open, and checked since
    return socket


async def closed_4401(socket):
    frame = json.loads(await socket.receive_from(timeout=5))
    assert frame == {"type": "error", "code": 4401, "detail": "Your session ended: log in again."}
    assert await socket.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}


async def still_streams(socket, job):
    await publish_and_route(job, [10])
    assert json.loads(await socket.receive_from(timeout=5))["seq"] == 10


async def test_a_logout_closes_the_socket_4401_and_others_stay_open(application, job, alice, bob, bobs_job):
    mine, theirs = await watch(application, job, alice), await watch(application, bobs_job, bob)
    await sync_to_async(alice.logout)()  # the session is deleted
    await closed_4401(mine)
    assert await theirs.receive_nothing(timeout=CHECK_SECONDS * 4)  # checked again, and fine
    await still_streams(theirs, bobs_job)
    await theirs.disconnect()


async def test_a_password_change_closes_the_socket_4401(application, job, alice, user, bob, bobs_job):
    mine, theirs = await watch(application, job, alice), await watch(application, bobs_job, bob)
    user.set_password("changed")
    await sync_to_async(user.save)()  # the session's auth hash is no longer the user's
    await closed_4401(mine)
    await still_streams(theirs, bobs_job)
    await theirs.disconnect()


async def test_a_deactivated_user_is_closed_4401(application, job, alice, user, bob, bobs_job):
    mine, theirs = await watch(application, job, alice), await watch(application, bobs_job, bob)
    user.is_active = False
    await sync_to_async(user.save)()
    await closed_4401(mine)
    await still_streams(theirs, bobs_job)
    await theirs.disconnect()


def checked(claims):
    """ended_sessions(claims), and the database queries it made."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        ended = ended_sessions(claims)
    return ended, len(queries)


async def test_every_socket_of_a_session_closes_and_one_check_reads_each_session_once(
    job, alice, bob, bobs_job, engine
):
    """One check per interval for the process, whatever its sockets: a session's sockets share
    its read, and a database engine reads every session in one query, the users in one more."""
    application = JobStreamApplication()
    mine = [await watch(application, job, alice) for _ in range(3)]
    theirs = await watch(application, bobs_job, bob)
    claims = {(s.session_key, s.user_id) for s in list(get_session_watch()._sockets)}
    assert len(claims) == 2
    assert await sync_to_async(checked)(claims) == (set(), 2 if engine == "db" else 1)
    await sync_to_async(alice.logout)()
    for socket in mine:
        await closed_4401(socket)
    await still_streams(theirs, bobs_job)
    await theirs.disconnect()
