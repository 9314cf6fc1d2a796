"""gateway.uvicorn.WebSocketProtocol: uvicorn's websockets-sansio protocol keeping less per socket,
run in a real uvicorn server serving config.asgi, with a real WebSocket client."""

import asyncio
import json

import pytest
import uvicorn
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from config.redis_server import free_port
from gateway.uvicorn import Gate, Inbox, WebSocketProtocol

from .conftest import publish_and_route

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("hub_closed")]


@pytest.fixture
async def server():
    from config.asgi import application

    config = uvicorn.Config(
        application,
        host="127.0.0.1",
        port=free_port(),
        ws=WebSocketProtocol,
        lifespan="off",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    yield server
    server.should_exit = True
    await asyncio.wait_for(task, 10)


def socket(server, path, cookie=None, origin="http://testserver"):
    return connect(
        f"ws://127.0.0.1:{server.config.port}{path}",
        origin=origin,
        additional_headers={"Cookie": f"sessionid={cookie}"} if cookie else None,
        proxy=None,
        open_timeout=5,
    )


def protocols(server) -> list[WebSocketProtocol]:
    return [c for c in server.server_state.connections if isinstance(c, WebSocketProtocol)]


async def test_a_socket_streams_its_job_and_keeps_no_handshake(server, job, cookie):
    await publish_and_route(job, [10, 11])
    async with socket(server, f"/ws/jobs/{job.op_id}/", cookie) as ws:
        assert [json.loads(await asyncio.wait_for(ws.recv(), 5))["seq"] for _ in range(2)] == [10, 11]
        [protocol] = protocols(server)
        assert protocol.request is None and protocol.response is None
        assert not list(protocol.conn.parser.gi_frame.f_locals["request"].headers.raw_items())
        assert isinstance(protocol.queue, Inbox) and isinstance(protocol.writable, Gate)
        await publish_and_route(job, [12])
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["seq"] == 12


async def test_refusals_reach_the_client(server, job, cookie, other_cookie):
    async with socket(server, f"/ws/jobs/{job.op_id}/") as ws:
        assert json.loads(await ws.recv())["code"] == 4401
        await asyncio.wait_for(ws.wait_closed(), 5)
        assert ws.close_code == 4401
    async with socket(server, f"/ws/jobs/{job.op_id}/", other_cookie) as ws:
        await asyncio.wait_for(ws.wait_closed(), 5)
        assert ws.close_code == 4404
    with pytest.raises(InvalidStatus) as refused:
        async with socket(server, f"/ws/jobs/{job.op_id}/", cookie, origin="http://evil.example"):
            pass
    assert refused.value.response.status_code == 403


async def test_the_server_hears_a_client_leave(server, job, cookie):
    async with socket(server, f"/ws/jobs/{job.op_id}/", cookie):
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
