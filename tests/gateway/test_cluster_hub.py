"""The gateway hub on a real 3-master Redis Cluster: the router publishes with SPUBLISH and the
hub listens with SSUBSCRIBE, one connection per master that owns a channel listened to; a
channel whose slot moves to another master is followed there, and its sockets lose nothing."""

import pytest
import redis
from asgiref.sync import sync_to_async

from eventbus.bus.keys import JobKeys
from eventbus.models import Job
from eventbus.redis.placement import move_slot
from gateway.hub import get_hub
from tests.eventbus.helpers import shard_subscribers
from tests.processes import wait_for

from .conftest import open_socket, publish_and_route
from .test_consumer import SCAN, frames_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("hub_closed")]


def jobs_on_every_master(cluster, user, masters=3):
    """One scan job whose channel each master owns."""
    jobs, owners = [], set()
    n = 0
    while len(owners) < masters:
        n += 1
        job = Job(scope="-:1", idem_key=f"c{n}", domain="scan", event_type="job.requested", owner=user)
        owner = cluster.get_node_from_key(JobKeys("scan", str(job.id)).channel).name
        if owner not in owners:
            owners.add(owner)
            job.save()
            jobs.append(job)
    return jobs


async def test_sockets_on_every_master_get_each_event_once(cluster, user, cookie):
    jobs = await sync_to_async(jobs_on_every_master)(cluster, user)
    sockets = [await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job) for job in jobs]
    assert get_hub().lines == 3  # a pub/sub connection per master, not one per socket
    for job in jobs:
        await publish_and_route(job, SCAN)
    for socket in sockets:
        assert [f["seq"] for f in await frames_until(socket, 51)] == SCAN
        assert await socket.receive_nothing(timeout=0.2)
        await socket.disconnect()


async def watched_job(cluster, user, cookie, seqs):
    """A scan job, its channel and a socket watching it that got these seqs."""
    [job] = (await sync_to_async(jobs_on_every_master)(cluster, user))[:1]
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
    await publish_and_route(job, seqs)
    assert [f["seq"] for f in await frames_until(socket, seqs[-1])] == seqs
    return job, JobKeys("scan", str(job.id)).channel, socket


async def test_a_channel_whose_slot_moves_is_followed_to_its_new_master(own_cluster, user, cookie):
    servers, cluster = own_cluster
    job, channel, socket = await watched_job(cluster, user, cookie, SCAN[:3])

    slot = cluster.keyslot(channel)
    source = cluster.get_node_from_key(channel).port
    target = next(node.port for node in servers.nodes if node.port != source)
    await sync_to_async(move_slot)(cluster, slot, f"127.0.0.1:{target}")
    # Redis tells the shard channel's subscribers that it moved (sunsubscribe); the hub follows.
    await sync_to_async(wait_for)(
        lambda: shard_subscribers(cluster, channel) == 1,
        timeout=15,
        message="the hub subscribed on the channel's new master",
    )
    await publish_and_route(job, SCAN[3:])
    assert [f["seq"] for f in await frames_until(socket, 51)] == SCAN[3:]
    assert await socket.receive_nothing(timeout=0.3)
    await socket.disconnect()


async def test_a_channel_is_followed_through_a_failover_of_its_master(replicated_cluster, user, cookie):
    servers, cluster = replicated_cluster
    job, channel, socket = await watched_job(cluster, user, cookie, SCAN[:2])

    old = cluster.get_node_from_key(channel).port
    new = await sync_to_async(servers.failover)(old)
    await sync_to_async(cluster.nodes_manager.initialize)()
    await publish_and_route(job, SCAN[2:])  # on the new master, maybe before the hub follows
    assert [f["seq"] for f in await frames_until(socket, 51)] == SCAN[2:]
    assert await socket.receive_nothing(timeout=0.3)
    with redis.Redis(port=new) as master:
        assert master.pubsub_shardnumsub(channel)[0][1] == 1
    await socket.disconnect()
