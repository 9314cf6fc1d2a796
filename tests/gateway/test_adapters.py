"""gateway.adapters: each fast path on a library's internals and its fallback on the public API
behave the same (routing answers, frames delivered, channels' session wrapper skipped or not,
uvicorn's protocol serving a socket end to end), and the gate takes the fallback for a release
outside the range tested, or when EXACTLY_ONCE_INTERNALS=off forces it.

Both paths run in one process, whichever EXACTLY_ONCE_INTERNALS the suite runs with: a test
imports a fresh copy of an adapter module with its gate forced one way (the module in
sys.modules, which the gateway runs, is left as it is) and, for the end-to-end tests, puts what
the copy bound where gateway.asgi and gateway.consumers look it up. A fast path is tested only
where the installed release lies in its tested range (the version matrix's other legs)."""

import json
import sys
import types

import pytest
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from channels.sessions import InstanceSessionWrapper
from django import urls
from websockets.exceptions import InvalidStatus

import exactly_once.internals
import gateway.asgi
import gateway.consumers
import gateway.servers
from gateway.adapters import uvicorn_protocols as uvicorn_adapter
from gateway.adapters.channels import PatternRoutes, ResolvedRoutes
from gateway.asgi import JobStreamApplication
from gateway.consumers import JobStreamConsumer
from gateway.hub import Frame
from gateway.routing import websocket_urlpatterns
from tests.adapters import fresh_module

from .conftest import make_communicator, open_socket, publish_and_route, uvicorn_server, uvicorn_socket

INTERNALS, PUBLIC = "internals", "public API"
CHANNELS, UVICORN = "gateway.adapters.channels", "gateway.adapters.uvicorn_protocols"
# Each gate's distribution and range, as the adapters ask it.
RANGES = {"channels": ("4.1", "4.4"), "django": ("5.2", "6.2"), "uvicorn": ("0.44", "0.55")}


def in_range(*distributions: str) -> bool:
    """The installed releases of `distributions` all lie in the ranges their fast paths were tested on."""
    for distribution in distributions:
        found = exactly_once.internals.installed(distribution)
        lowest, below = RANGES[distribution]
        if found is None or not (
            exactly_once.internals.release(lowest) <= found < exactly_once.internals.release(below)
        ):
            return False
    return True


@pytest.fixture
def load(monkeypatch):
    """`load(name, mode, **releases)`: a fresh copy of adapter module `name`, its gate asked with
    the fallbacks forced (PUBLIC) or not (INTERNALS), and with `installed()` answering `releases`
    (distribution -> release tuple, or None: not installed) for the distributions named. What the
    gate records (adapters_in_use) is restored after the test."""
    monkeypatch.setattr(exactly_once.internals, "_decisions", dict(exactly_once.internals._decisions))
    real = exactly_once.internals.installed

    def load(name, mode=INTERNALS, **releases):
        if mode == PUBLIC:
            monkeypatch.setenv(exactly_once.internals.ENVIRONMENT_VARIABLE, "off")
        else:
            monkeypatch.delenv(exactly_once.internals.ENVIRONMENT_VARIABLE, raising=False)
        monkeypatch.setattr(
            exactly_once.internals, "installed", lambda d: releases[d] if d in releases else real(d)
        )
        return fresh_module(name)

    return load


@pytest.fixture(params=[INTERNALS, PUBLIC])
def gateway_path(request, load, monkeypatch):
    """The gateway running either path: fresh adapters, their bindings put in gateway.asgi and
    gateway.consumers (JobStreamApplication looks Routes up when it is made)."""
    if request.param == INTERNALS and not in_range("channels", "django"):
        pytest.skip("an installed release is outside its fast path's tested range")
    channels, uvicorn = load(CHANNELS, request.param), load(UVICORN, request.param)
    monkeypatch.setattr(gateway.asgi, "Routes", channels.Routes)
    monkeypatch.setattr(gateway.asgi, "connection_app", channels.connection_app)
    monkeypatch.setattr(gateway.consumers, "frames_send", channels.frames_send)
    monkeypatch.setattr(gateway.consumers, "reporting_gone", uvicorn.reporting_gone)
    others = tuple(e for e in gateway.servers.ClientGone if e not in uvicorn_adapter.CLIENT_GONE)
    monkeypatch.setattr(gateway.consumers, "ClientGone", (*others, *uvicorn.CLIENT_GONE))
    return types.SimpleNamespace(name=request.param, channels=channels, uvicorn=uvicorn)


def channels_stack():
    return AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))


# Routing: Django's URL patterns matched one by one, or resolve().


async def positional(scope, receive, send):
    pass


async def typed(scope, receive, send):
    pass


ROUTES = [
    *websocket_urlpatterns,
    urls.re_path(r"^ws/old/(\d+)/(\w+)/$", positional),
    urls.path("ws/typed/<int:n>/<slug:name>/", typed, kwargs={"n": 0, "extra": True}),
]
JOB_STREAM = websocket_urlpatterns[0].callback


@pytest.mark.parametrize(
    "path, expected",
    [
        ("ws/jobs/abc/", (JOB_STREAM, (), {"job_id": "abc"})),
        ("ws/jobs/no%20uuid/", (JOB_STREAM, (), {"job_id": "no%20uuid"})),
        ("ws/old/12/x/", (positional, ("12", "x"), {})),
        # A route's default kwargs win over the captured ones, as Django and channels have it.
        ("ws/typed/7/a-b/", (typed, (), {"n": 0, "name": "a-b", "extra": True})),
        ("ws/typed/x/a-b/", None),
        ("ws/jobs/", None),
        ("ws/jobs/abc/more/", None),
        ("ws/jobs/abc", None),
        ("", None),
    ],
)
def test_both_routings_answer_the_same(path, expected):
    if in_range("django"):
        assert PatternRoutes(ROUTES).match(path) == expected
    assert ResolvedRoutes(ROUTES).match(path) == expected


@pytest.mark.parametrize(
    ("root_path", "path"),
    [("", "/ws/jobs/{}/"), ("/prefix", "/prefix/ws/jobs/{}/")],
    ids=["root", "root_path"],
)
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("hub_closed")
async def test_each_path_routes_and_streams_a_job(gateway_path, job, cookie, root_path, path):
    application = JobStreamApplication()
    assert isinstance(application.routes, gateway_path.channels.Routes)
    await publish_and_route(job, [10, 11])
    socket = make_communicator(path.format(job.id), cookie, application=application)
    socket.scope["root_path"] = root_path
    assert (await socket.connect(timeout=5))[0]
    assert [json.loads(await socket.receive_from(timeout=5))["seq"] for _ in range(2)] == [10, 11]
    await socket.disconnect()
    for no_job_stream in ("/ws/jobs/", "/ws/other/1/", f"/ws/jobs/{job.id}/more/"):
        refused = make_communicator(no_job_stream, cookie, application=application)
        assert not (await refused.connect(timeout=5))[0]
        await refused.disconnect()


def test_the_fast_path_awaits_the_consumer_itself(load):
    """as_asgi()'s function makes the consumer and awaits it (a coroutine frame more per socket)."""
    app = JobStreamConsumer.as_asgi()
    assert load(CHANNELS, PUBLIC).connection_app(app) is app
    if in_range("channels"):
        consumer = load(CHANNELS, INTERNALS).connection_app(app)
        assert type(consumer) is JobStreamConsumer
    assert load(CHANNELS, INTERNALS).connection_app(positional) is positional  # no consumer: as it is


# channels' session wrapper: skipped by frames, or not.


@pytest.mark.django_db  # channels 4.1 loads the session synchronously, from the database
@pytest.mark.parametrize("mode", [INTERNALS, PUBLIC])
async def test_frames_reach_the_servers_send_past_the_session_wrapper_or_through_it(load, mode):
    """The session wrapper saves a session on HTTP responses only: the fast path's frames skip it
    (it read the session twice per frame) and reach the send the server gave; the fallback's go
    through it, to the same send."""
    if mode == INTERNALS and not in_range("channels"):
        pytest.skip("channels is outside the fast path's tested range")
    adapter = load(CHANNELS, mode)
    sent = []

    async def server_send(message):
        sent.append(message)

    outer = InstanceSessionWrapper({"cookies": {}}, server_send)
    await outer.resolve_session()
    inner = InstanceSessionWrapper(outer.scope, outer.send)  # stacked: the outer one is active
    send = adapter.frames_send(inner.send)
    assert send is server_send if mode == INTERNALS else send == inner.send
    consumer = JobStreamConsumer()
    consumer.base_send = inner.send
    consumer.server_send = send
    await consumer._transmit(Frame(b'{"type":"event","seq":1}', {"type": "event", "seq": 1}))
    assert sent == [{"type": "websocket.send", "text": '{"type":"event","seq":1}'}]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("hub_closed")
async def test_through_channels_stack_frames_skip_the_session_wrapper_on_the_fast_path_only(
    gateway_path, job, cookie, monkeypatch
):
    through_wrapper = []
    original = InstanceSessionWrapper.send

    async def counted(self, message):
        through_wrapper.append(message["type"])
        return await original(self, message)

    monkeypatch.setattr(InstanceSessionWrapper, "send", counted)
    await publish_and_route(job, [10, 11])
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, application=channels_stack())
    assert [json.loads(await socket.receive_from(timeout=5))["seq"] for _ in range(2)] == [10, 11]
    frames = [] if gateway_path.name == INTERNALS else ["websocket.send"] * 2
    assert through_wrapper == ["websocket.accept", *frames]
    await socket.disconnect()


# uvicorn: its protocol, and its error for a client gone.


# uvicorn's `--ws websockets` (websockets' legacy API) is deprecated by both: a fallback only for a
# release without websockets-sansio (before 0.35, outside the uvicorn extra's range).
LEGACY = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize("protocol", ["lean", "websockets-sansio", pytest.param("websockets", marks=LEGACY)])
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("hub_closed")
async def test_each_protocol_serves_the_job_stream_end_to_end(
    protocol, job, cookie, other_cookie, monkeypatch
):
    """The fast path's protocol, and the fallback's: uvicorn's own websockets-sansio protocol, or
    `--ws websockets`'s in a release without that one."""
    from uvicorn.config import WS_PROTOCOLS
    from uvicorn.importer import import_from_string

    if protocol == "lean":
        if not in_range("uvicorn"):
            pytest.skip("uvicorn is outside the fast path's tested range")
        ws = uvicorn_adapter.lean_protocol()
    else:
        expected = import_from_string(WS_PROTOCOLS[protocol])
        if protocol == "websockets":
            monkeypatch.delitem(WS_PROTOCOLS, "websockets-sansio")  # as in a release without it
        ws = uvicorn_adapter.public_protocol()
        assert ws is expected
    await publish_and_route(job, [10, 11])
    async with uvicorn_server(ws) as server:
        async with uvicorn_socket(server, f"/ws/jobs/{job.id}/", cookie) as client:
            assert [json.loads(await client.recv())["seq"] for _ in range(2)] == [10, 11]
            assert [type(c) for c in server.server_state.connections] == [ws]
            await publish_and_route(job, [12])
            assert json.loads(await client.recv())["seq"] == 12
        async with uvicorn_socket(server, f"/ws/jobs/{job.id}/", other_cookie) as client:
            assert json.loads(await client.recv())["code"] == 4404
            await client.wait_closed()
            assert client.protocol.close_code == 4404  # websockets 13 has no close_code of its own
        with pytest.raises(InvalidStatus) as refused:
            async with uvicorn_socket(server, f"/ws/jobs/{job.id}/", cookie, origin="http://evil.example"):
                pass
        assert refused.value.response.status_code == 403


async def test_a_send_to_a_client_gone_is_told_apart_on_both_paths(load):
    from uvicorn.protocols.utils import ClientDisconnected

    sent = []

    async def send(message):
        sent.append(message)

    async def send_to_a_client_gone(message):
        raise ClientDisconnected()

    public = load(UVICORN, PUBLIC)
    await public.reporting_gone(send)({"type": "websocket.send", "text": "1"})
    assert sent == [{"type": "websocket.send", "text": "1"}]
    with pytest.raises(public.CLIENT_GONE):
        await public.reporting_gone(send_to_a_client_gone)({"type": "websocket.send", "text": "2"})
    # An OSError from anything but the send (a Redis read in a catch-up) is no client gone.
    assert not issubclass(ConnectionResetError, public.CLIENT_GONE)
    if in_range("uvicorn"):
        fast = load(UVICORN, INTERNALS)
        assert fast.reporting_gone(send) is send and (ClientDisconnected,) == fast.CLIENT_GONE


# The gate.


@pytest.mark.parametrize(
    "releases",
    [
        {"channels": (4, 0, 3), "django": (5, 1, 15), "uvicorn": (0, 43, 0)},
        {"channels": (4, 4, 0), "django": (6, 2), "uvicorn": (0, 55, 0)},
    ],
    ids=["older", "newer"],
)
def test_a_release_outside_the_range_tested_takes_the_public_api(load, releases):
    channels, uvicorn = load(CHANNELS, **releases), load(UVICORN, **releases)
    assert (channels.CHANNELS_INTERNALS, channels.URL_PATTERN_INTERNALS, uvicorn.INTERNALS) == (False,) * 3
    wrapper = InstanceSessionWrapper({"cookies": {}}, None)
    assert channels.frames_send(wrapper.send) == wrapper.send
    app = JobStreamConsumer.as_asgi()
    assert channels.connection_app(app) is app
    assert channels.Routes is channels.ResolvedRoutes
    assert uvicorn.websocket_protocol is uvicorn.public_protocol
    assert uvicorn.http_protocol is uvicorn.public_http_protocol
    assert (uvicorn.ClientLeft,) == uvicorn.CLIENT_GONE
    in_use = exactly_once.internals.adapters_in_use()
    assert [in_use[name] for name in (CHANNELS, f"{CHANNELS}.url_patterns", UVICORN)] == ["public API"] * 3


def test_each_fast_path_is_taken_where_its_release_was_tested_unless_forced_off(load):
    url_patterns = f"{CHANNELS}.url_patterns"
    expected = {
        CHANNELS: in_range("channels"),
        url_patterns: in_range("django"),
        UVICORN: in_range("uvicorn"),
    }
    for mode in (INTERNALS, PUBLIC):
        channels, uvicorn = load(CHANNELS, mode), load(UVICORN, mode)
        taken = {
            CHANNELS: channels.CHANNELS_INTERNALS,
            url_patterns: channels.URL_PATTERN_INTERNALS,
            UVICORN: uvicorn.INTERNALS,
        }
        fast = expected if mode == INTERNALS else dict.fromkeys(expected, False)
        assert taken == fast
        assert (channels.Routes is channels.PatternRoutes) == fast[url_patterns]
        assert (uvicorn.websocket_protocol is uvicorn.lean_protocol) == fast[UVICORN]
        assert (uvicorn.http_protocol is uvicorn.head_timeout_protocol) == fast[UVICORN]
        in_use = exactly_once.internals.adapters_in_use()
        assert {name: in_use[name] for name in fast} == {
            name: "internals" if internals else "public API" for name, internals in fast.items()
        }


def test_without_uvicorn_the_gateway_imports_and_knows_daphnes_error_only(load, monkeypatch):
    """Under daphne alone: nothing imports uvicorn, and a client gone is daphne's error only."""
    from autobahn.exception import Disconnected

    for name in [name for name in sys.modules if name == "uvicorn" or name.startswith("uvicorn.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # `import uvicorn` raises ImportError
    adapter = load(UVICORN, INTERNALS, uvicorn=None)
    assert not adapter.INTERNALS and adapter.CLIENT_GONE == ()
    assert adapter.reporting_gone(print) is print
    monkeypatch.setitem(sys.modules, UVICORN, adapter)
    assert fresh_module("gateway.servers").ClientGone == (Disconnected,)
    with pytest.raises(ImportError):
        adapter.websocket_protocol()  # `--ws gateway.uvicorn:WebSocketProtocol` needs uvicorn
    with pytest.raises(ImportError):
        adapter.http_protocol()  # and `--http gateway.uvicorn:HTTPProtocol`
    assert "uvicorn" not in {name.partition(".")[0] for name, m in sys.modules.items() if m is not None}
