"""gateway.uvicorn.WebSocketProtocol: uvicorn's websockets-sansio protocol keeping less per socket
(uvicorn's own where gateway.adapters.uvicorn_protocols takes the public API), run in a real uvicorn server
serving config.asgi, with a real WebSocket client."""

import asyncio
import json

import pytest
from websockets.exceptions import InvalidStatus

from gateway.adapters import uvicorn_protocols as adapter
from gateway.adapters.uvicorn_protocols import Gate, Inbox
from gateway.uvicorn import WebSocketProtocol

from .conftest import publish_and_route, uvicorn_server, uvicorn_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("hub_closed")]


@pytest.fixture
async def server():
    async with uvicorn_server(WebSocketProtocol) as server:
        yield server


def protocols(server) -> list:
    return [c for c in server.server_state.connections if isinstance(c, WebSocketProtocol)]


async def test_a_socket_streams_its_job_and_keeps_no_handshake(server, job, cookie):
    await publish_and_route(job, [10, 11])
    async with uvicorn_socket(server, f"/ws/jobs/{job.id}/", cookie) as ws:
        assert [json.loads(await asyncio.wait_for(ws.recv(), 5))["seq"] for _ in range(2)] == [10, 11]
        [protocol] = protocols(server)
        if adapter.INTERNALS:
            assert protocol.request is None and protocol.response is None
            assert not list(protocol.conn.parser.gi_frame.f_locals["request"].headers.raw_items())
            assert isinstance(protocol.queue, Inbox) and isinstance(protocol.writable, Gate)
        else:  # uvicorn's own protocol, as it is
            assert type(protocol) is adapter.public_protocol()
        await publish_and_route(job, [12])
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["seq"] == 12


async def test_refusals_reach_the_client(server, job, cookie, other_cookie):
    async with uvicorn_socket(server, f"/ws/jobs/{job.id}/") as ws:
        assert json.loads(await ws.recv())["code"] == 4401
        await asyncio.wait_for(ws.wait_closed(), 5)
        assert ws.protocol.close_code == 4401  # websockets 13 has no close_code of its own
    async with uvicorn_socket(server, f"/ws/jobs/{job.id}/", other_cookie) as ws:
        await asyncio.wait_for(ws.wait_closed(), 5)
        assert ws.protocol.close_code == 4404
    with pytest.raises(InvalidStatus) as refused:
        async with uvicorn_socket(server, f"/ws/jobs/{job.id}/", cookie, origin="http://evil.example"):
            pass
    assert refused.value.response.status_code == 403


async def test_the_server_hears_a_client_leave(server, job, cookie):
    async with uvicorn_socket(server, f"/ws/jobs/{job.id}/", cookie):
        while not protocols(server):
            await asyncio.sleep(0.01)
    for _ in range(500):
        if not protocols(server):
            break
        await asyncio.sleep(0.01)
    assert protocols(server) == []


async def test_inbox_is_a_fifo_whose_waiting_readers_take_turns():
    inbox = Inbox()
    first, second = asyncio.ensure_future(inbox.get()), asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)
    inbox.put_nowait("a")
    first.cancel()  # woken for "a", then cancelled: "a" goes to the other reader
    await asyncio.sleep(0)
    assert await asyncio.wait_for(second, 1) == "a"
    inbox.put_nowait("b")
    inbox.put_nowait("c")
    assert inbox.qsize() == 2 and [await inbox.get(), await inbox.get()] == ["b", "c"] and inbox.empty()
    assert inbox._waiters == []  # a woken or cancelled reader leaves no waiter behind


async def test_gate_holds_waiters_while_cleared():
    gate = Gate()
    assert gate.is_set() and await gate.wait()
    gate.clear()
    waiter = asyncio.ensure_future(gate.wait())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    gate.set()
    assert await asyncio.wait_for(waiter, 1) is True
    assert gate._waiters == []
