"""The job stream consumer through the real ASGI app: auth, parameters, backfill then live,
reset, slow clients, and a Redis pub/sub connection killed mid-stream."""

import asyncio
import json
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from eventbus.bus.keys import JobKeys
from eventbus.models import Job
from gateway import consumers
from gateway.hub import close_hub, get_hub

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
    socket = await open_socket(f"/ws/jobs/{job.id}/")
    await closed_with(socket, 4401)


async def test_other_users_job_and_unknown_job_are_4404(job, other_cookie):
    socket = await open_socket(f"/ws/jobs/{job.id}/", other_cookie)
    await closed_with(socket, 4404)
    socket = await open_socket("/ws/jobs/00000000-0000-0000-0000-000000000000/", other_cookie)
    await closed_with(socket, 4404)


@pytest.mark.parametrize(
    "query",
    [
        "last_seq=-1",
        "last_seq=abc",
        "last_seq=1&last_seq=2",
        "last_seq=",
        "last_seq=99999999999999999999",
        "last_seq=%FF",
        "last_seq=" + "9" * 5000,  # past int()'s 4,300 digits: ValueError, not 4400, before
        "last_seq=" + "0" * 5000 + "1",
        "last_seq=١",  # an Arabic-Indic one: a digit to str.isdigit(), not ASCII
    ],
    ids=lambda query: query[:40],
)
async def test_bad_parameters_are_4400(job, cookie, query):
    socket = await open_socket(f"/ws/jobs/{job.id}/?{query}", cookie)
    await closed_with(socket, 4400)


async def test_bad_job_id_is_4400(cookie):
    socket = await open_socket("/ws/jobs/not-a-uuid/", cookie)
    await closed_with(socket, 4400)


async def test_an_unsafe_redis_is_warned_about_once_or_refused_by_setting(job, cookie, settings, caplog):
    # The suite's Redis has no append-only file: not safe for the bus (eventbus.redis.durability).
    with caplog.at_level("WARNING", logger="eventbus.redis.durability"):
        for _ in range(2):
            socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
            await socket.disconnect()
    warnings = [r.getMessage() for r in caplog.records if "REDIS IS NOT SAFE" in r.getMessage()]
    assert warnings and all(w.startswith("gateway: ") for w in warnings)
    assert len(warnings) == len(set(warnings))  # once per process, not per socket
    await close_hub()  # a new process's hub: the check runs again
    settings.EVENTBUS = {**settings.EVENTBUS, "REDIS_DURABILITY": "refuse"}
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie)
    await closed_with(socket, 1011)
    assert get_hub().channels == 0  # nothing subscribed


async def test_backfill_then_live_without_duplicate_or_gap(job, cookie):
    await publish_and_route(job, SCAN[:4])
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
    await publish_and_route(job, SCAN[4:])
    frames = await frames_until(socket, 51)
    assert [f["seq"] for f in frames] == SCAN
    first = frames[0]
    assert first["type"] == "event" and first["job_id"] == str(job.id) and first["domain"] == "scan"
    assert first["stage"] == "vision" and first["data"] == {"seq": 10} and first["stream_id"]
    assert await socket.receive_nothing(timeout=0.3)
    await socket.disconnect()


async def test_the_database_away_at_connect_is_waited_out_not_a_1011(job, cookie, monkeypatch, caplog):
    """A lost database connection (a failover, a killed backend) while the socket looks its
    job up: the socket retries until the database answers, then streams as usual."""
    from django.db import OperationalError

    find_job, failures = consumers.find_job, []

    async def flaky_find_job(user, job_id):
        if len(failures) < 2:
            failures.append(job_id)
            raise OperationalError("terminating connection due to administrator command")
        return await find_job(user, job_id)

    monkeypatch.setattr(consumers, "find_job", flaky_find_job)
    await publish_and_route(job, SCAN)
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie)
    assert [f["seq"] for f in await frames_until(socket, 51)] == SCAN
    assert len(failures) == 2
    assert any("the database is away" in r.getMessage() for r in caplog.records)
    await socket.disconnect()


async def test_resume_sends_only_what_follows_last_seq(job, cookie):
    await publish_and_route(job, SCAN)
    socket = await open_socket(f"/ws/jobs/{job.id}/?last_seq=21", cookie)
    assert [f["seq"] for f in await frames_until(socket, 51)] == [30, 40, 50, 51]
    assert await socket.receive_nothing(timeout=0.3)


async def test_staff_without_the_view_permission_get_4404(job, staff_cookie):
    await publish_and_route(job, SCAN[:2])
    socket = await open_socket(f"/ws/jobs/{job.id}/", staff_cookie)
    await closed_with(socket, 4404)


async def test_the_view_permission_may_watch_any_job(job, viewer_cookie):
    await publish_and_route(job, SCAN[:2])
    socket = await open_socket(f"/ws/jobs/{job.id}/", viewer_cookie)
    assert [f["seq"] for f in await frames_until(socket, 11)] == [10, 11]


async def test_expired_history_gives_a_reset_frame(job, cookie, redis_client):
    await publish_and_route(job, SCAN[:5])
    redis_client.delete(JobKeys("scan", str(job.id)).history)  # expired
    socket = await open_socket(f"/ws/jobs/{job.id}/?last_seq=11", cookie)
    reset = json.loads(await socket.receive_from(timeout=5))
    assert reset["type"] == "reset" and reset["recovered"] is False and reset["state"]["seq"] == 21
    await publish_and_route(job, SCAN[5:])
    assert [f["seq"] for f in await frames_until(socket, 51)] == [30, 40, 50, 51]


async def test_history_that_no_longer_reaches_back_gives_a_reset(job, cookie, redis_client):
    await publish_and_route(job, SCAN[:5])
    redis_client.zremrangebyscore(JobKeys("scan", str(job.id)).history, 0, 20)  # trimmed: 12, 20 gone
    socket = await open_socket(f"/ws/jobs/{job.id}/?last_seq=11", cookie)
    reset = json.loads(await socket.receive_from(timeout=5))
    assert reset["type"] == "reset" and reset["recovered"] is False and reset["state"]["seq"] == 21
    assert await socket.receive_nothing(timeout=0.3)  # 21 is in the snapshot: not sent again
    await publish_and_route(job, SCAN[5:])
    assert [f["seq"] for f in await frames_until(socket, 51)] == [30, 40, 50, 51]


async def test_everything_expired_resets_from_the_database(job, cookie, redis_client):
    # Older than the keys' TTL: the client's events may have expired (job keys all gone).
    await sync_to_async(Job.objects.filter(pk=job.pk).update)(accepted_at=timezone.now() - timedelta(hours=2))
    socket = await open_socket(f"/ws/jobs/{job.id}/?last_seq=30", cookie)
    reset = json.loads(await socket.receive_from(timeout=5))
    assert reset["type"] == "reset" and reset["state"]["state"] == "PENDING" and reset["state"]["seq"] == 30


async def test_a_young_job_whose_keys_were_lost_waits_for_their_republish_not_a_reset(
    job, cookie, redis_client
):
    """A failover to a replica that lagged lost what the client saw (history, applied seq and
    state of a job younger than their TTL): the job's run publishes them again, so the client
    waits for them instead of a reset, and gets the rest once, without a gap."""
    await publish_and_route(job, SCAN[:5])
    await set_state(job, "RUNNING")
    keys = JobKeys("scan", str(job.id))
    redis_client.delete(keys.history, keys.applied, keys.state, keys.last_published)
    for stage, seq in (("vision", 10), ("vision", 11), ("vision", 12), ("rule", 20), ("rule", 21)):
        redis_client.delete(keys.published(stage, seq), keys.router_published(seq))
    redis_client.xdel(keys.stream, *[entry_id for entry_id, _ in redis_client.xrange(keys.stream)])
    socket = await open_socket(f"/ws/jobs/{job.id}/?last_seq=21", cookie, subscribed_to=job)
    assert await socket.receive_nothing(timeout=0.5)  # no reset
    await publish_and_route(job, SCAN)  # the run again: everything republished, then the rest
    assert [f["seq"] for f in await frames_until(socket, 51)] == [30, 40, 50, 51]
    assert await socket.receive_nothing(timeout=0.3)


async def test_a_slow_client_is_closed_4008_and_resumes_losing_nothing(job, cookie, settings, monkeypatch):
    settings.GATEWAY = {"QUEUE_SIZE": 2}
    release = asyncio.Event()
    original = consumers.JobStreamConsumer._transmit

    async def stalled_send(self, frame):
        await release.wait()  # the client stops reading: the server's send waits for its buffer
        await original(self, frame)

    monkeypatch.setattr(consumers.JobStreamConsumer, "_transmit", stalled_send)
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
    await publish_and_route(job, SCAN)
    await closed_with(socket, 4008)
    monkeypatch.setattr(consumers.JobStreamConsumer, "_transmit", original)
    again = await open_socket(f"/ws/jobs/{job.id}/?last_seq=0", cookie)
    assert [f["seq"] for f in await frames_until(again, 51)] == SCAN


async def test_sockets_share_one_pubsub_connection(job, cookie, redis_client):
    sockets = [await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job) for _ in range(20)]
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


async def test_the_hub_reader_ends_with_its_last_channel_and_starts_with_the_next(job, cookie):
    """The pub/sub reader blocks on the connection (no timeout per read): the confirmation of
    the last UNSUBSCRIBE must still end it, and the next socket must get a reader again."""
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
    await publish_and_route(job, SCAN[:1])
    assert [f["seq"] for f in await frames_until(socket, 10)] == [10]
    line = get_hub()._lines["redis"]
    reader = line.reader
    assert reader is not None and not reader.done()
    await socket.disconnect()
    await asyncio.wait_for(asyncio.shield(reader), timeout=5)  # ended, not waiting for a message
    assert reader.exception() is None
    again = await open_socket(f"/ws/jobs/{job.id}/?last_seq=10", cookie, subscribed_to=job)
    assert line.reader is not reader and not line.reader.done()
    await publish_and_route(job, SCAN[1:2])
    assert [f["seq"] for f in await frames_until(again, SCAN[1])] == [SCAN[1]]
    await again.disconnect()


async def test_pubsub_connection_killed_mid_stream_loses_nothing(job, cookie, redis_client):
    """Redis drops the hub's connection and refuses new ones while the job goes on: the
    events published meanwhile never reach pub/sub; the hub reconnects, resyncs every socket
    from history, and each socket gets every seq once."""
    sockets = [await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job) for _ in range(3)]
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


async def test_the_sockets_of_a_job_resync_from_one_history_read(job, cookie, redis_client):
    """After a blip every socket resyncs at once: the sockets of one job share one history read
    (each still gets exactly what follows its own last seq)."""
    await publish_and_route(job, SCAN[:3])
    resumed_at = [0, 10, 11, 10, 0]  # each gets a frame: its first backfill is over before we count
    sockets = [
        await open_socket(f"/ws/jobs/{job.id}/?last_seq={seq}", cookie, subscribed_to=job)
        for seq in resumed_at
    ]
    for socket, seq in zip(sockets, resumed_at):
        assert [f["seq"] for f in await frames_until(socket, 12)] == [s for s in SCAN[:3] if s > seq]
    await publish_and_route(job, [])
    reads = redis_client.info("commandstats")["cmdstat_zrangebyscore"]["calls"]
    maxclients = redis_client.config_get("maxclients")["maxclients"]
    redis_client.config_set("maxclients", len(redis_client.client_list()) - 1)  # the hub stays away
    try:
        assert redis_client.client_kill_filter(_type="pubsub") == 1
        await publish_and_route(job, SCAN[3:])  # nothing of it reaches pub/sub
        await asyncio.sleep(0.3)
    finally:
        redis_client.config_set("maxclients", maxclients)
    for socket in sockets:
        assert [f["seq"] for f in await frames_until(socket, 51, timeout=20)] == SCAN[3:]
        assert await socket.receive_nothing(timeout=0.2)
    assert get_hub().reconnections == 1
    assert redis_client.info("commandstats")["cmdstat_zrangebyscore"]["calls"] - reads == 1


async def test_the_jobs_of_a_process_resync_in_one_round_trip_and_a_bad_history_fails_alone(
    job, user, cookie, redis_client, monkeypatch
):
    """After a blip the history reads of every job wait to be sent together (up to READ_BATCH a
    round trip); a job whose history holds what is not JSON fails only its own sockets (1011)."""
    from gateway import hub as hub_module

    jobs = [job] + [
        await sync_to_async(Job.objects.create)(
            scope="-:1", idem_key=f"ws-job-{i}", domain="scan", event_type="job.requested", owner=user
        )
        for i in range(3)
    ]
    sockets = [await open_socket(f"/ws/jobs/{j.id}/", cookie, subscribed_to=j) for j in jobs]
    for j in jobs[:3]:
        await publish_and_route(j, SCAN[:1])
    for socket in sockets[:3]:
        assert [f["seq"] for f in await frames_until(socket, 10)] == [10]
    redis_client.zadd(JobKeys("scan", str(jobs[3].id)).history, {b"not json": 5})
    batches = []
    original = hub_module.read_backfills

    async def recorded(client, asks):
        batches.append(len(asks))
        return await original(client, asks)

    monkeypatch.setattr(hub_module, "read_backfills", recorded)
    assert redis_client.client_kill_filter(_type="pubsub") == 1
    assert await sockets[3].receive_output(timeout=10) == {"type": "websocket.close", "code": 1011}
    for j in jobs[:3]:
        await publish_and_route(j, SCAN[1:2])
    for socket in sockets[:3]:
        assert [f["seq"] for f in await frames_until(socket, 11, timeout=20)] == [11]
        assert await socket.receive_nothing(timeout=0.2)
    assert batches[0] == 4  # the four jobs' reads in one round trip


async def test_a_foreign_message_on_the_channel_stops_nothing(job, cookie, redis_client):
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
    channel = JobKeys("scan", str(job.id)).channel
    # The last one nested past the JSON parser's recursion: a RecursionError killed the reader.
    for garbage in (b"not json", b"[1, 2]", b'{"no": "seq"}', b"[" * 100_000 + b"]" * 100_000):
        redis_client.publish(channel, garbage)
    await publish_and_route(job, SCAN)
    assert [f["seq"] for f in await frames_until(socket, 51)] == SCAN


# --- A job that ended: the client gets its outcome, never waits for nothing ---------------------


def _publish(job, seqs, *, final=False, route=True):
    """Publish these events of the job (the last one final when `final`), then route them."""
    from eventbus import publish_event
    from eventbus.bus.router import Router

    for seq in seqs:
        stage = {1: "vision", 2: "rule", 3: "answer", 4: "reward", 5: "done"}[seq // 10]
        data = {"seq": seq}
        if final and seq == seqs[-1]:
            data.update(state="COMPLETED", final=True)
        publish_event(job.domain, str(job.id), stage, seq, data)
    if route:
        Router(burst=True, consumer="test-router").run()


publish = sync_to_async(_publish, thread_sensitive=False)


async def set_state(job, state):
    await sync_to_async(Job.objects.filter(pk=job.pk).update)(state=state)


def outcome(job, state, seq):
    """A reset frame built from the database."""
    return {
        "type": "reset",
        "recovered": False,
        "state": {"job_id": str(job.id), "domain": "scan", "state": state, "seq": seq},
    }


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED", "TIMED_OUT"])
async def test_a_new_client_of_an_ended_job_whose_keys_expired_gets_its_outcome(job, cookie, state):
    await set_state(job, state)  # and nothing of it left in Redis: history, applied seq, state expired
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie)
    assert json.loads(await socket.receive_from(timeout=5)) == outcome(job, state, 0)
    assert await socket.receive_nothing(timeout=0.3)


@pytest.mark.parametrize("state", ["PENDING", "RUNNING"])
async def test_a_new_client_of_a_job_not_ended_with_nothing_in_redis_waits(job, cookie, state):
    await set_state(job, state)
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
    assert await socket.receive_nothing(timeout=0.3)
    await publish_and_route(job, SCAN)
    assert [f["seq"] for f in await frames_until(socket, 51)] == SCAN  # events, no reset
    assert await socket.receive_nothing(timeout=0.3)


@pytest.mark.parametrize("last_seq, sent", [(0, [10, 11, 12, 20]), (11, [12, 20]), (20, [])])
async def test_a_job_that_ended_without_a_final_event_gives_its_outcome_after_its_history(
    job, cookie, last_seq, sent
):
    """Its final event never reached Redis (the job failed while Redis was down): the history
    ends at 20, the database says FAILED."""
    await publish(job, SCAN[:4])
    await set_state(job, "FAILED")
    socket = await open_socket(f"/ws/jobs/{job.id}/?last_seq={last_seq}", cookie)
    frames = [json.loads(await socket.receive_from(timeout=5)) for _ in range(len(sent) + 1)]
    assert [f["seq"] for f in frames[:-1]] == sent
    assert frames[-1] == outcome(job, "FAILED", 20)
    assert await socket.receive_nothing(timeout=0.3)


async def test_a_job_whose_history_and_state_expired_before_its_applied_seq_gives_its_outcome(
    job, cookie, redis_client
):
    """The applied seq outlives the history and the state KV (DEDUP TTL > HISTORY TTL)."""
    await publish(job, SCAN[:4])
    await set_state(job, "COMPLETED")
    keys = JobKeys("scan", str(job.id))
    redis_client.delete(keys.history, keys.state)  # expired; the applied seq (20) is still there
    socket = await open_socket(f"/ws/jobs/{job.id}/?last_seq=20", cookie)
    assert json.loads(await socket.receive_from(timeout=5)) == outcome(job, "COMPLETED", 20)
    assert await socket.receive_nothing(timeout=0.3)


@pytest.mark.parametrize("last_seq", [0, 51])
async def test_a_client_that_gets_the_final_event_gets_no_reset(job, cookie, last_seq):
    await publish(job, SCAN, final=True)
    await set_state(job, "COMPLETED")
    socket = await open_socket(f"/ws/jobs/{job.id}/?last_seq={last_seq}", cookie)
    if last_seq == 0:
        frames = await frames_until(socket, 51)
        assert [f["type"] for f in frames] == ["event"] * len(SCAN)
        assert frames[-1]["data"]["final"] is True
    assert await socket.receive_nothing(timeout=0.3)


async def test_events_on_their_way_to_the_history_are_awaited_not_reset(job, cookie):
    """The job ended and its events are published, but the router has not applied them yet."""
    await publish(job, SCAN, final=True, route=False)
    await set_state(job, "COMPLETED")
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
    assert await socket.receive_nothing(timeout=0.3)
    await publish(job, [])  # the router runs
    frames = await frames_until(socket, 51)
    assert [(f["type"], f["seq"]) for f in frames] == [("event", seq) for seq in SCAN]
    assert await socket.receive_nothing(timeout=0.3)


async def test_a_job_that_ended_while_redis_was_away_gives_its_outcome_on_resync(job, cookie, redis_client):
    """A socket open while the job runs; Redis goes away, the job fails meanwhile and its final
    event is never published. When the hub is back it resyncs the socket, which asks the
    database again and gives the client the outcome."""
    await set_state(job, "RUNNING")
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
    await publish_and_route(job, SCAN[:3])
    assert [f["seq"] for f in await frames_until(socket, 12)] == SCAN[:3]
    await set_state(job, "FAILED")  # no final event: Redis was down
    assert redis_client.client_kill_filter(_type="pubsub") == 1
    assert json.loads(await socket.receive_from(timeout=10)) == outcome(job, "FAILED", 12)
    assert await socket.receive_nothing(timeout=0.3)
    assert get_hub().reconnections == 1
