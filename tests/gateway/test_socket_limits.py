"""The gateway's connection limits against a real uvicorn server (the Procfile's options and
gateway.uvicorn's protocols, serving config.asgi) and real clients: the per-user socket cap
(4429), a data frame refused by the consumer (1003), a frame over the Procfile's --ws-max-size
(1009), a client that stops answering the server's pings, and a connection whose request head
does not come in time, each dropped by the server."""

import asyncio
import base64
import contextlib
import json
import os
import shlex

import pytest

from gateway.adapters import uvicorn_protocols as adapter
from gateway.socketcap import sockets_per_user
from gateway.uvicorn import HTTPProtocol, WebSocketProtocol
from tests.processes import BASE_DIR

from .conftest import publish_and_route, uvicorn_server, uvicorn_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("hub_closed")]

LIMITS = (
    "http",
    "ws_max_size",
    "ws_ping_interval",
    "ws_ping_timeout",
    "timeout_keep_alive",
    "limit_concurrency",
)


def procfile_limits() -> dict:
    """The limits of the Procfile's web command, as uvicorn's command line parses them."""
    import uvicorn

    [web] = [line for line in (BASE_DIR / "Procfile").read_text().splitlines() if line.startswith("web:")]
    args = shlex.split(web.removeprefix("web:").replace("${WEB_PORT:-8000}", "8000"))
    options = uvicorn.main.make_context("uvicorn", args[args.index("uvicorn") + 1 :]).params
    return {name: options[name] for name in LIMITS}


PROCFILE = procfile_limits()
MAX_SIZE = PROCFILE["ws_max_size"]
PING = 0.5  # instead of the Procfile's 20 s
KEEP_ALIVE = 1  # instead of its 5 s


@pytest.fixture
async def server():
    options = {
        **PROCFILE,
        "ws_ping_interval": PING,
        "ws_ping_timeout": PING,
        "timeout_keep_alive": KEEP_ALIVE,
    }
    async with uvicorn_server(WebSocketProtocol, **options) as server:
        yield server


def test_the_procfile_bounds_frames_and_sets_its_timeouts():
    assert PROCFILE["http"] == "gateway.uvicorn:HTTPProtocol"
    assert MAX_SIZE < 65536  # the client sends nothing but pings: not uvicorn's 16 MiB
    assert PROCFILE["ws_ping_interval"] and PROCFILE["ws_ping_timeout"]
    assert PROCFILE["timeout_keep_alive"] and PROCFILE["limit_concurrency"]


@pytest.fixture
def cap(settings):
    settings.GATEWAY = {**getattr(settings, "GATEWAY", {}), "MAX_SOCKETS_PER_USER": 2}


async def first_seq(ws) -> int:
    return json.loads(await asyncio.wait_for(ws.recv(), 5))["seq"]


async def until(predicate, timeout=30.0):
    """Poll (on the server's loop, which is this one) until predicate() holds; a generous bound."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "not within the bound"
        await asyncio.sleep(0.01)


async def test_a_users_socket_over_the_cap_is_closed_4429(server, cap, job, user, cookie, viewer_cookie):
    await publish_and_route(job, [10])
    path = f"/ws/jobs/{job.id}/"
    async with contextlib.AsyncExitStack() as sockets:
        first = await sockets.enter_async_context(uvicorn_socket(server, path, cookie))
        second = await sockets.enter_async_context(uvicorn_socket(server, path, cookie))
        assert [await first_seq(first), await first_seq(second)] == [10, 10]
        assert sockets_per_user.held(user.pk) == 2

        async with uvicorn_socket(server, path, cookie) as third:
            frame = json.loads(await asyncio.wait_for(third.recv(), 5))
            assert frame["type"] == "error" and frame["code"] == 4429 and frame["detail"]
            await asyncio.wait_for(third.wait_closed(), 5)
            assert third.protocol.close_code == 4429
        assert sockets_per_user.held(user.pk) == 2  # the refused one took no place

        # The cap is per user: another user (one who may see every job) still streams.
        async with uvicorn_socket(server, path, viewer_cookie) as viewers:
            assert await first_seq(viewers) == 10

        await first.close()
        await until(lambda: sockets_per_user.held(user.pk) == 1)
        async with uvicorn_socket(server, path, cookie) as again:
            assert await first_seq(again) == 10  # a place freed: the next one streams
    await until(lambda: sockets_per_user.held(user.pk) == 0)


async def test_a_data_frame_closes_the_socket_1003(server, job, user, cookie):
    await publish_and_route(job, [10])
    async with uvicorn_socket(server, f"/ws/jobs/{job.id}/", cookie) as ws:
        assert await first_seq(ws) == 10
        await ws.send("hello")
        frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert frame["type"] == "error" and frame["code"] == 1003
        await asyncio.wait_for(ws.wait_closed(), 5)
        assert ws.protocol.close_code == 1003
    await until(lambda: sockets_per_user.held(user.pk) == 0)


async def test_a_frame_over_the_servers_max_size_closes_the_socket_1009(server, job, cookie):
    await publish_and_route(job, [10])
    async with uvicorn_socket(server, f"/ws/jobs/{job.id}/", cookie) as ws:
        assert await first_seq(ws) == 10
        await ws.send(b"x" * 65536)  # under uvicorn's default (16 MiB) the consumer would close 1003
        await asyncio.wait_for(ws.wait_closed(), 10)
        assert ws.protocol.close_code == 1009  # the server's: the consumer never got the frame


async def test_a_client_that_stops_answering_pings_is_dropped(server, job, user, cookie):
    """A socket whose client went silent (half-open: gone without a FIN, or never reading) is
    closed by the server's ping timeout, and its place under the cap freed."""
    key = base64.b64encode(os.urandom(16)).decode()
    handshake = (
        f"GET /ws/jobs/{job.id}/ HTTP/1.1\r\nHost: testserver\r\nOrigin: http://testserver\r\n"
        f"Cookie: sessionid={cookie}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.config.port)
    try:
        writer.write(handshake)
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 101")
        await until(lambda: sockets_per_user.held(user.pk) == 1)
        # Never a pong: read (the pings, then the close) until the server ends the connection.
        await asyncio.wait_for(reader.read(-1), 30)  # -1: to EOF
        await until(lambda: sockets_per_user.held(user.pk) == 0)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_the_cap_counts_sockets_in_this_process():
    from gateway.socketcap import SocketCount

    count = SocketCount()
    assert all(count.take("u") for _ in range(100))  # the default cap, 100
    assert not count.take("u") and count.take("v")
    count.release("u")
    assert count.take("u") and count.held("u") == 100


async def read_to_end(reader, timeout=30.0) -> bytes:
    """What the server sends until it ends the connection (a generous bound)."""
    return await asyncio.wait_for(reader.read(-1), timeout)


@pytest.mark.parametrize("head", [b"", b"GET /ws/jobs/ HTTP/1.1\r\nHost: testserver\r\n"])
async def test_a_connection_whose_head_does_not_come_is_closed(server, head):
    assert server.config.http_protocol_class is HTTPProtocol
    reader, writer = await asyncio.open_connection("127.0.0.1", server.config.port)
    try:
        writer.write(head)  # nothing, or a head that never ends
        if adapter.INTERNALS:
            assert await read_to_end(reader) == b""  # closed, unanswered
        else:  # uvicorn's own protocol holds it: the proxy in front must close it
            with pytest.raises(asyncio.TimeoutError):
                await read_to_end(reader, timeout=KEEP_ALIVE * 3)
    finally:
        writer.close()


async def test_a_head_sent_in_parts_in_time_is_answered_and_the_next_one_too(server):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.config.port)
    try:
        for _ in range(2):  # one keep-alive connection, two requests
            writer.write(b"GET /nothing-here/ HTTP/1.1\r\n")
            await asyncio.sleep(KEEP_ALIVE / 4)
            writer.write(b"Host: testserver\r\n\r\n")
            assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 404")
            length = 0
            while (line := await asyncio.wait_for(reader.readline(), 10)) != b"\r\n":
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            await asyncio.wait_for(reader.readexactly(length), 10)  # the body
    finally:
        writer.close()
