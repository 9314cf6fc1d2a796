"""The gateway and the bus across Redis restarts, for real.

A socket opened while Redis is down waits for it, then streams (it is not closed 1011).

Redis losing its recent writes: a restart that loses the last second of its
append-only file, or a failover to a replica that lagged, leave Redis as it was some time ago
while the database and the watchers went on. Here a Redis server is snapshotted mid-job, the
job goes on (a stage finishes, the next one reports and its worker dies), watchers see it all,
then the server is SIGKILLed and started again from the snapshot.

The outcome (docs/design/durability.md, "Durability and recovery"): the job completes; a watcher that saw the lost
events gets neither a duplicate nor a gap (nor, here, a reset); a new watcher gets every event
once; the stream holds each (job, stage, seq) once. The finished stage's events come back from
its stage record, the unfinished stage runs again under the same seqs.
"""

import json
import time

import pytest
import redis
from asgiref.sync import sync_to_async

from config.redis_server import RedisServer
from eventbus.bus.router import Router
from eventbus.job import runs
from eventbus.models import Job
from gateway.hub import get_hub
from tests.eventbus.helpers import job_events
from tests.eventbus.jobtypes import StagedJob, lines
from tests.processes import wait_for

from .conftest import open_socket, publish_and_route

pytestmark = [
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("hub_closed"),
]

STAGED = [("first", 10), ("second", 20), ("second", 21), ("third", 30), ("done", 51)]


@pytest.fixture
def snapshot_redis(settings, tmp_path):
    """The bus on a Redis of its own that persists only when told to (SAVE)."""
    server = RedisServer(data_dir=tmp_path / "redis").start()
    settings.EVENTBUS = {**settings.EVENTBUS, "REDIS_URL": server.url}
    try:
        yield server
    finally:
        server.stop()


def route() -> None:
    Router(burst=True, consumer="lost-writes").run()


def run_when_free(job_id: str) -> str:
    """runs.run, as the worker's task runs it again when the job's lease is held."""
    deadline = time.monotonic() + 15
    while True:
        try:
            return runs.run(job_id)
        except runs.JobBusy:
            assert time.monotonic() < deadline, "the lease was never released"
            time.sleep(0.2)


async def seqs_until(socket, last: int) -> list[int]:
    """The seqs of the frames up to `last`; a reset or an error fails."""
    seqs: list[int] = []
    while not seqs or seqs[-1] != last:
        frame = json.loads(await socket.receive_from(timeout=15))
        assert frame["type"] == "event", frame
        seqs.append(frame["seq"])
    return seqs


async def test_redis_back_from_an_older_snapshot_loses_no_event_and_doubles_none(
    snapshot_redis, user, cookie, tmp_path, monkeypatch
):
    log_path = str(tmp_path / "work.log")
    job = await sync_to_async(Job.objects.create)(
        scope=f"t:{user.pk}", idem_key="lost", owner=user, domain="staged", payload={"log": log_path}
    )
    server = redis.Redis(port=snapshot_redis.port)
    real_second, real_third = StagedJob.second, StagedJob.third

    def second(self, ctx):
        if ctx.attempt == 1:  # the first stage's event is applied: Redis persists this moment
            route()
            server.save()
        return real_second(self, ctx)

    def third(self, ctx):
        if ctx.attempt == 1:  # reports, then its worker dies
            ctx.report(done=1, of=1)
            raise redis.ConnectionError("the worker died")
        return real_third(self, ctx)

    monkeypatch.setattr(StagedJob, "second", second)
    monkeypatch.setattr(StagedJob, "third", third)
    with pytest.raises(redis.ConnectionError):
        await sync_to_async(runs.run)(str(job.id), fail_on_transient=False)
    await sync_to_async(route)()

    watcher = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
    assert await seqs_until(watcher, 30) == [10, 20, 21, 30]

    # Redis dies and comes back as it was at the snapshot: event 10 applied, nothing after.
    snapshot_redis.process.kill()
    snapshot_redis.process.wait()
    snapshot_redis.start()
    assert await sync_to_async(job_events)(server, "staged", job.id) == [("first", 10)]
    hub = get_hub()
    await sync_to_async(wait_for)(lambda: hub.reconnections >= 1, timeout=15, message="the hub back")
    await watcher.receive_nothing(timeout=1)  # it waits: no reset, no event again

    # The snapshot holds the first run's lease too: the new run waits for it to expire (5 s).
    assert await sync_to_async(run_when_free)(str(job.id)) == Job.State.COMPLETED
    await sync_to_async(route)()
    assert await seqs_until(watcher, 51) == [51]
    await watcher.receive_nothing(timeout=0.5)
    newcomer = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
    assert await seqs_until(newcomer, 51) == [10, 20, 21, 30, 51]
    for socket in (watcher, newcomer):
        await socket.disconnect()

    assert await sync_to_async(job_events)(server, "staged", job.id) == STAGED
    work = lines(log_path)
    assert work.count("first") == 1 and work.count("second charged") == 1  # finished stages ran once
    assert work.count("third") == 1  # the stage that died ran again (its log line: second run only)
    server.close()


async def test_a_socket_opened_while_redis_is_down_waits_for_it_then_streams(snapshot_redis, job, cookie):
    snapshot_redis.kill()
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie)
    await socket.receive_nothing(timeout=1)  # open, waiting: no close, no error frame
    snapshot_redis.start()
    await sync_to_async(wait_subscribed_sync)(job)
    await publish_and_route(job, [10, 20])
    assert await seqs_until(socket, 20) == [10, 20]
    await socket.disconnect()


def wait_subscribed_sync(job) -> None:
    from eventbus.bus.keys import JobKeys
    from eventbus.redis.clients import get_redis

    channel = JobKeys(job.domain, str(job.id)).channel
    wait_for(lambda: get_redis().pubsub_numsub(channel)[0][1], timeout=15, message="the hub subscribed")
