"""The job stream consumer through the real ASGI app: auth, parameters, backfill then live,
reset, slow clients, and a Redis pub/sub connection killed mid-stream."""
import asyncio
import json

import pytest

from eventbus.keys import JobKeys
from gateway import consumers
from gateway.hub import get_hub

from .conftest import open_socket, publish_and_route

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("hub_closed")]
SCAN = [10, 11, 12, 20, 21, 30, 40, 50, 51]


async def frames_until(communicator, last_seq, timeout=10):
    """Every frame up to the one with seq == last_seq."""
    frames = []
    while True:
        frame = json.loads(await communicator.receive_from(timeout=timeout))
        frames.append(frame)
        if frame.get("seq") == last_seq or frame["type"] == "error":
            return frames


async def closed_with(communicator, code):
    frame = json.loads(await communicator.receive_from(timeout=5))
    assert frame["type"] == "error" and frame["code"] == code
    output = await communicator.receive_output(timeout=5)
    assert output == {"type": "websocket.close", "code": code}


async def test_not_logged_in_is_4401(job):
    socket = await open_socket(f"/ws/jobs/{job.op_id}/")
    await closed_with(socket, 4401)


async def test_other_users_job_and_unknown_job_are_4404(job, other_cookie):
    socket = await open_socket(f"/ws/jobs/{job.op_id}/", other_cookie)
    await closed_with(socket, 4404)
    socket = await open_socket("/ws/jobs/00000000-0000-0000-0000-000000000000/", other_cookie)
    await closed_with(socket, 4404)


@pytest.mark.parametrize("query", ["last_seq=-1", "last_seq=abc", "last_seq=1&last_seq=2", "last_seq=",
                                   "last_seq=99999999999999999999", "last_seq=%FF"])
async def test_bad_parameters_are_4400(job, cookie, query):
    socket = await open_socket(f"/ws/jobs/{job.op_id}/?{query}", cookie)
    await closed_with(socket, 4400)


async def test_bad_job_id_is_4400(cookie):
    socket = await open_socket("/ws/jobs/not-a-uuid/", cookie)
    await closed_with(socket, 4400)


async def test_backfill_then_live_without_duplicate_or_gap(job, cookie):
    await publish_and_route(job, SCAN[:4])
    socket = await open_socket(f"/ws/jobs/{job.op_id}/", cookie, subscribed_to=job)
    await publish_and_route(job, SCAN[4:])
    frames = await frames_until(socket, 51)
    assert [f["seq"] for f in frames] == SCAN
    first = frames[0]
    assert first["type"] == "event" and first["job_id"] == str(job.op_id) and first["domain"] == "scan"
    assert first["stage"] == "vision" and first["data"] == {"seq": 10} and first["stream_id"]
    assert await socket.receive_nothing(timeout=0.3)
    await socket.disconnect()


async def test_resume_sends_only_what_follows_last_seq(job, cookie):
    await publish_and_route(job, SCAN)
    socket = await open_socket(f"/ws/jobs/{job.op_id}/?last_seq=21", cookie)
    assert [f["seq"] for f in await frames_until(socket, 51)] == [30, 40, 50, 51]
    assert await socket.receive_nothing(timeout=0.3)


async def test_staff_may_watch_any_job(job, staff_cookie):
    await publish_and_route(job, SCAN[:2])
    socket = await open_socket(f"/ws/jobs/{job.op_id}/", staff_cookie)
    assert [f["seq"] for f in await frames_until(socket, 11)] == [10, 11]


async def test_expired_history_gives_a_reset_frame(job, cookie, redis_client):
    await publish_and_route(job, SCAN[:5])
    redis_client.delete(JobKeys("scan", str(job.op_id)).history)  # expired
    socket = await open_socket(f"/ws/jobs/{job.op_id}/?last_seq=11", cookie)
    reset = json.loads(await socket.receive_from(timeout=5))
    assert reset["type"] == "reset" and reset["recovered"] is False and reset["state"]["seq"] == 21
    await publish_and_route(job, SCAN[5:])
    assert [f["seq"] for f in await frames_until(socket, 51)] == [30, 40, 50, 51]


async def test_history_that_no_longer_reaches_back_gives_a_reset(job, cookie, redis_client):
    await publish_and_route(job, SCAN[:5])
    redis_client.zremrangebyscore(JobKeys("scan", str(job.op_id)).history, 0, 20)  # trimmed: 12, 20 gone
    socket = await open_socket(f"/ws/jobs/{job.op_id}/?last_seq=11", cookie)
    reset = json.loads(await socket.receive_from(timeout=5))
    assert reset["type"] == "reset" and reset["recovered"] is False and reset["state"]["seq"] == 21
    assert await socket.receive_nothing(timeout=0.3)  # 21 is in the snapshot: not sent again
    await publish_and_route(job, SCAN[5:])
    assert [f["seq"] for f in await frames_until(socket, 51)] == [30, 40, 50, 51]


async def test_everything_expired_resets_from_the_database(job, cookie, redis_client):
    socket = await open_socket(f"/ws/jobs/{job.op_id}/?last_seq=30", cookie)
    reset = json.loads(await socket.receive_from(timeout=5))
    assert reset["type"] == "reset" and reset["state"]["state"] == "PENDING" and reset["state"]["seq"] == 30


async def test_a_slow_client_is_closed_4008_and_resumes_losing_nothing(job, cookie, settings,
                                                                       monkeypatch):
    settings.GATEWAY = {"QUEUE_SIZE": 2}
    release = asyncio.Event()
    original = consumers.JobStreamConsumer._send_event

    async def stalled_send(self, raw, seq):
        await release.wait()  # the client stops reading
        await original(self, raw, seq)

    monkeypatch.setattr(consumers.JobStreamConsumer, "_send_event", stalled_send)
    socket = await open_socket(f"/ws/jobs/{job.op_id}/", cookie, subscribed_to=job)
    await publish_and_route(job, SCAN)
    await closed_with(socket, 4008)
    monkeypatch.setattr(consumers.JobStreamConsumer, "_send_event", original)
    again = await open_socket(f"/ws/jobs/{job.op_id}/?last_seq=0", cookie)
    assert [f["seq"] for f in await frames_until(again, 51)] == SCAN


async def test_sockets_share_one_pubsub_connection(job, cookie, redis_client):
    sockets = [await open_socket(f"/ws/jobs/{job.op_id}/", cookie, subscribed_to=job) for _ in range(20)]
    await publish_and_route(job, SCAN[:1])
    for socket in sockets:
        assert [f["seq"] for f in await frames_until(socket, 10)] == [10]
    # The previous test's hub may still be closing: wait for the count to settle, then insist on 1.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 3
    while len(redis_client.client_list(_type="pubsub")) > 1 and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert len(redis_client.client_list(_type="pubsub")) == 1
    assert get_hub().channels == 1
    for socket in sockets:
        await socket.disconnect()
    assert get_hub().channels == 0


async def test_pubsub_connection_killed_mid_stream_loses_nothing(job, cookie, redis_client):
    """Redis drops the hub's connection and refuses new ones while the job goes on: the
    events published meanwhile never reach pub/sub; the hub reconnects, resyncs every socket
    from history, and each socket gets every seq once."""
    sockets = [await open_socket(f"/ws/jobs/{job.op_id}/", cookie, subscribed_to=job) for _ in range(3)]
    await publish_and_route(job, SCAN[:3])
    for socket in sockets:
        assert [f["seq"] for f in await frames_until(socket, 12)] == SCAN[:3]
    # Warm the router's pooled connection, then refuse new clients while the hub's is killed.
    await publish_and_route(job, [])
    maxclients = redis_client.config_get("maxclients")["maxclients"]
    redis_client.config_set("maxclients", len(redis_client.client_list()) - 1)  # the hub's slot is gone
    try:
        assert redis_client.client_kill_filter(_type="pubsub") == 1
        await publish_and_route(job, SCAN[3:])  # published while the hub is away
        await asyncio.sleep(0.3)
    finally:
        redis_client.config_set("maxclients", maxclients)
    for socket in sockets:
        frames = await frames_until(socket, 51, timeout=20)
        assert [f["seq"] for f in frames] == SCAN[3:]
        assert await socket.receive_nothing(timeout=0.2)
    assert get_hub().reconnections == 1


async def test_a_foreign_message_on_the_channel_stops_nothing(job, cookie, redis_client):
    socket = await open_socket(f"/ws/jobs/{job.op_id}/", cookie, subscribed_to=job)
    channel = JobKeys("scan", str(job.op_id)).channel
    for garbage in (b"not json", b"[1, 2]", b'{"no": "seq"}'):
        redis_client.publish(channel, garbage)
    await publish_and_route(job, SCAN)
    assert [f["seq"] for f in await frames_until(socket, 51)] == SCAN
