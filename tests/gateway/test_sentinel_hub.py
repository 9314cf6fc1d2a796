"""The gateway hub on a Sentinel-managed Redis (real: 1 master, 1 replica, 3 sentinels): a
watcher's socket stays open through a failover and gets every event once, those published
before, during and after it (the hub follows the master through the sentinels and resyncs)."""

import pytest
from asgiref.sync import sync_to_async

from gateway.hub import get_hub
from tests.processes import wait_for

from .conftest import open_socket, publish_and_route
from .test_consumer import frames_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("hub_closed")]


async def test_a_watcher_gets_every_event_once_across_a_failover(sentinel_bus, job, cookie):
    socket = await open_socket(f"/ws/jobs/{job.id}/", cookie, subscribed_to=job)
    await publish_and_route(job, [10, 11])
    assert [f["seq"] for f in await frames_until(socket, 11)] == [10, 11]
    hub = get_hub()
    await sync_to_async(sentinel_bus.failover)()
    await publish_and_route(job, [20])  # on the new master, maybe before the hub is back
    await sync_to_async(wait_for)(lambda: hub.reconnections >= 1, timeout=15, message="the hub back")
    await publish_and_route(job, [21, 30, 51])
    assert [f["seq"] for f in await frames_until(socket, 51)] == [20, 21, 30, 51]
    await socket.receive_nothing(timeout=0.5)
    await socket.disconnect()
