"""The job stream's WebSocket entry (gateway.asgi.JobStreamApplication, config.asgi's), and
channels' stack as the README wired it before, which must keep working: the Origin check, session
auth, the owner or the view permission, and the route."""

import gc
import json
import weakref

import pytest
from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator

import gateway.asgi
from gateway.asgi import JobStreamApplication
from gateway.routing import websocket_urlpatterns

from .conftest import make_communicator, open_socket, publish_and_route

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("hub_closed")]


def channels_stack():
    return AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))


STACKS = pytest.mark.parametrize(
    "stack", [JobStreamApplication, channels_stack], ids=["gateway.asgi", "channels"]
)


@pytest.fixture(params=[JobStreamApplication, channels_stack], ids=["gateway.asgi", "channels"])
def application(request):
    return request.param()


async def refused(communicator):
    """The handshake is refused (HTTP 403 from the server): never accepted."""
    connected, _ = await communicator.connect(timeout=5)
    assert not connected
    await communicator.disconnect()


async def closed_with(communicator, code):
    frame = json.loads(await communicator.receive_from(timeout=5))
    assert frame["type"] == "error" and frame["code"] == code
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": code}


@pytest.mark.parametrize(
    "origin", [b"http://evil.example", b"https://testserver.evil.example", b"null", None]
)
async def test_an_origin_not_in_allowed_hosts_is_refused(application, job, cookie, origin):
    await refused(make_communicator(f"/ws/jobs/{job.id}/", cookie, application=application, origin=origin))


async def test_an_origin_that_is_no_url_is_refused(job, cookie):
    # channels' validator raises on it (the server answers 500); refused here.
    socket = make_communicator(
        f"/ws/jobs/{job.id}/", cookie, application=JobStreamApplication(), origin=b"http://[::1"
    )
    await refused(socket)


@STACKS
async def test_the_origin_may_be_any_allowed_host(stack, job, cookie, settings):
    settings.ALLOWED_HOSTS = [".example.com"]
    application = stack()  # AllowedHostsOriginValidator reads ALLOWED_HOSTS when it is built
    socket = make_communicator(
        f"/ws/jobs/{job.id}/", cookie, application=application, origin=b"https://api.example.com:8443"
    )
    assert (await socket.connect(timeout=5))[0]
    await socket.disconnect()


async def test_a_path_that_is_no_job_stream_is_refused(cookie):
    await refused(make_communicator("/ws/jobs/", cookie, application=JobStreamApplication()))
    await refused(make_communicator("/ws/other/1/", cookie, application=JobStreamApplication()))


async def test_no_session_or_an_unknown_one_is_4401(application, job):
    await closed_with(await open_socket(f"/ws/jobs/{job.id}/", application=application), 4401)
    socket = await open_socket(f"/ws/jobs/{job.id}/", "no-such-session", application=application)
    await closed_with(socket, 4401)


async def test_a_session_from_before_a_password_change_is_4401(application, job, cookie, user):
    # Django's get_user: the session's auth hash no longer matches the user's.
    user.set_password("changed")
    await sync_to_async(user.save)()
    await closed_with(await open_socket(f"/ws/jobs/{job.id}/", cookie, application=application), 4401)


async def test_another_users_job_is_4404_even_to_staff_and_the_view_permission_may_watch_it(
    application, job, other_cookie, staff_cookie, viewer_cookie
):
    socket = await open_socket(f"/ws/jobs/{job.id}/", other_cookie, application=application)
    await closed_with(socket, 4404)
    socket = await open_socket(f"/ws/jobs/{job.id}/", staff_cookie, application=application)
    await closed_with(socket, 4404)  # is_staff alone opens nothing
    await publish_and_route(job, [10, 11])
    socket = await open_socket(f"/ws/jobs/{job.id}/", viewer_cookie, application=application)
    assert [json.loads(await socket.receive_from(timeout=5))["seq"] for _ in range(2)] == [10, 11]
    await socket.disconnect()


async def test_the_owner_streams_and_nothing_keeps_the_user(job, cookie, monkeypatch):
    loaded = []
    original = gateway.asgi.session_user

    async def session_user(session_key):
        user = await original(session_key)
        loaded.append(weakref.ref(user))
        return user

    monkeypatch.setattr(gateway.asgi, "session_user", session_user)
    await publish_and_route(job, [10, 11])
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, application=JobStreamApplication())
    assert [json.loads(await socket.receive_from(timeout=5))["seq"] for _ in range(2)] == [10, 11]
    gc.collect()
    assert len(loaded) == 1 and loaded[0]() is None  # let go once the socket was authorized
    await socket.disconnect()
