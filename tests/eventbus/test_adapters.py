"""The adapters over redis-py's and Celery's internals (eventbus.adapters): each fast path and
its public-API fallback give the same results against real Redis (a server, a 3-master
cluster), both handle NOSCRIPT after SCRIPT FLUSH, and the gate takes the fallback for a release
outside the tested range, or when EXACTLY_ONCE_INTERNALS=off."""

import asyncio
import os
from types import SimpleNamespace

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

import exactly_once.internals
from eventbus import Event
from eventbus.adapters import celery as celery_adapter
from eventbus.bus.keys import JobKeys
from eventbus.bus.publish import _prepare
from eventbus.bus.scripts import PUBLISH
from eventbus.redis import internals as redis_adapter
from eventbus.redis.placement import _migrate_slot

PATHS = ["internals", "public"]
RUN = {"internals": redis_adapter._run_internals, "public": redis_adapter._run_public}
ARUN = {"internals": redis_adapter._arun_internals, "public": redis_adapter._arun_public}


def publish_calls(events):
    """The publish script's calls for these events, as eventbus.bus.publish builds them."""
    previous: dict = {}
    return [_prepare(Event(*event), previous)[0] for event in events]


BATCH = [
    ("scan", "a1", "vision", 10, {"n": 1}),
    ("scan", "a1", "vision", 10, {"n": 1}),  # a duplicate inside the batch
    ("chat", "a2", "answer", 30, "hi"),
    ("scan", "a1", "rule", 20, None),
    ("scan", "a1", "vision", 11, None),  # out of order: an error reply, the others run
    ("scan", "a3", "vision", 10, {"n": 3}),
]


def outcome(replies) -> list:
    """Replies comparable across paths: an error as its class and message."""
    return [(type(r).__name__, str(r)) if isinstance(r, Exception) else r for r in replies]


def streams(client, events) -> dict:
    """Each job's stream entries (fields only: the ids differ from run to run)."""
    found = {}
    for domain, job, *_ in events:
        key = JobKeys(domain, job).stream
        found[domain, job] = [fields for _, fields in client.xrange(key) if fields[b"job_id"].decode() == job]
    return found


def test_both_paths_give_the_same_replies_and_writes_on_one_server(redis_client):
    seen = {}
    for path in PATHS:
        redis_client.flushdb()
        replies = RUN[path](redis_client, publish_calls(BATCH))
        seen[path] = (outcome(replies), streams(redis_client, BATCH))
    assert seen["internals"] == seen["public"]
    replies, written = seen["internals"]
    assert replies[:4] == [1, 0, 1, 1] and replies[5] == 1
    assert replies[4][0] == "ResponseError" and replies[4][1].startswith("OUTOFORDER ")
    assert [f[b"seq"] for f in written["scan", "a1"]] == [b"10", b"20"]


@pytest.mark.parametrize("path", PATHS)
def test_each_path_loads_the_scripts_again_after_a_script_flush(redis_client, path):
    run = RUN[path]
    assert run(redis_client, publish_calls([("scan", "f1", "vision", 10, {})])) == [1]
    redis_client.script_flush()
    events = [("scan", "f1", "vision", 11, {}), ("chat", "f2", "answer", 30, {})]
    assert run(redis_client, publish_calls(events)) == [1, 1]
    assert redis_client.script_exists(PUBLISH.sha) == [True]


@pytest.mark.parametrize("path", PATHS)
def test_each_path_ends_a_round_trip_with_wait(redis_client, path):
    replies = RUN[path](redis_client, publish_calls(BATCH[:3]), ("WAIT", 0, 100))
    assert replies == [1, 0, 1, 0]  # the calls' replies, then WAIT's: no replica to wait for


def test_only_the_fast_path_sends_a_read_ahead(redis_client):
    """The public path's pipeline parses every reply: it does not send `first`, and the caller
    (the router) reads its next batch on its own."""
    heard: dict = {path: [] for path in PATHS}
    for path in PATHS:
        redis_client.flushdb()
        redis_client.set("ahead", "raw")
        first = (("GET", "ahead"), heard[path].append)
        assert RUN[path](redis_client, publish_calls(BATCH[:1]), (), first) == [1]
    assert heard == {"internals": [b"raw"], "public": []}


@pytest.mark.parametrize("path", PATHS)
async def test_each_async_path_gives_the_same_replies_and_reloads_flushed_scripts(redis_client, path):
    client = aioredis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        replies = outcome(await ARUN[path](client, publish_calls(BATCH)))
        redis_client.script_flush()
        again = await ARUN[path](client, publish_calls([("scan", "a1", "vision", 21, {})]))
    finally:
        await client.aclose()
    assert replies[:4] == [1, 0, 1, 1] and replies[5] == 1
    assert replies[4][0] == "ResponseError" and replies[4][1].startswith("OUTOFORDER ")
    assert again == [1]


def cluster_batch():
    return [(d, f"cj{n}", "vision", 10, {"n": n}) for n in range(6) for d in ("scan", "chat")]


def flush_scripts(nodes):
    for node in nodes:
        with redis.Redis(port=node.port) as client:
            client.script_flush()


def test_both_paths_give_the_same_replies_on_a_cluster_and_reload_flushed_scripts(
    cluster, redis_cluster_nodes
):
    events = cluster_batch()
    assert len({cluster.get_node_from_key(JobKeys(d, j).stream).name for d, j, *_ in events}) == 3
    seen = {}
    for path in PATHS:
        for node in redis_cluster_nodes:
            with node.client() as client:
                client.flushall()
        flush_scripts(redis_cluster_nodes)  # every master answers NOSCRIPT first
        first = RUN[path](cluster, publish_calls(events))
        again = RUN[path](cluster, publish_calls(events))
        seen[path] = (outcome(first), outcome(again), streams(cluster, events))
    assert seen["internals"] == seen["public"]
    assert seen["internals"][:2] == ([1] * len(events), [0] * len(events))


@pytest.mark.parametrize("path", PATHS)
async def test_each_async_path_runs_and_reloads_scripts_on_a_cluster(cluster, redis_cluster_nodes, path):
    from redis.asyncio.cluster import RedisCluster

    events = cluster_batch()
    flush_scripts(redis_cluster_nodes)
    client = RedisCluster.from_url(redis_cluster_nodes[0].url)
    try:
        assert await ARUN[path](client, publish_calls(events)) == [1] * len(events)
        assert await ARUN[path](client, publish_calls(events)) == [0] * len(events)
    finally:
        await client.aclose()


def test_both_paths_name_a_slots_node_as_the_cluster_map_does(cluster):
    for key in ("{scan:0}:events", "{chat:3}:events", "anything"):
        slot = cluster.keyslot(key)
        expected = cluster.get_node_from_key(key).name
        assert redis_adapter._node_of_slot_internals(cluster, slot).name == expected
        assert redis_adapter._node_of_slot_public(cluster, slot).name == expected
    assert cluster.keyslot(redis_adapter.key_in_slot(cluster, 12345)) == 12345


async def test_both_paths_follow_a_slot_moved_behind_the_clients_back(own_cluster):
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    servers, mover = own_cluster
    key = "{scan:1}:events"
    slot = mover.keyslot(key)
    fast, public = RedisCluster.from_url(servers.url), RedisCluster.from_url(servers.url)
    afast, apublic = AsyncRedisCluster.from_url(servers.url), AsyncRedisCluster.from_url(servers.url)
    try:
        await afast.initialize()
        await apublic.initialize()
        source = mover.get_node_from_key(key)
        target = next(node for node in mover.get_primaries() if node.name != source.name)
        _migrate_slot({node.name: node for node in mover.get_primaries()}, slot, source, target)
        clients = (fast, public, afast, apublic)
        assert {client.get_node_from_key(key).name for client in clients} == {source.name}  # stale

        redis_adapter._follow_moved_slots_internals(fast, [slot])
        redis_adapter._follow_moved_slots_public(public, [slot])
        await redis_adapter._refresh_slot_map_internals(afast)
        await redis_adapter._refresh_slot_map_public(apublic)
        assert {client.get_node_from_key(key).name for client in clients} == {target.name}
        await apublic.set(key, "1")  # closed and initialized again: still in use
        assert public.get(key) == b"1"
    finally:
        await afast.aclose()
        await apublic.aclose()
        fast.close()
        public.close()


PUBSUBS = {"internals": redis_adapter._tracked_pubsub, "public": redis_adapter._PublicPubSub}


async def read_until(pubsub, kind, timeout=10.0):
    """The messages read up to the first of this type; a lost connection is read again, as the
    gateway's hub does (redis-py reconnects at the next read)."""
    read = []
    async with asyncio.timeout(timeout):
        while not read or read[-1]["type"] != kind:
            try:
                message = await pubsub.get_message(timeout=1.0)
            except (redis.ConnectionError, redis.TimeoutError):
                await asyncio.sleep(0.05)
                continue
            if message is not None:
                read.append(message)
    return read


@pytest.mark.parametrize("path", PATHS)
async def test_each_pubsub_path_tells_of_a_reconnection_once(redis_client, path):
    client = aioredis.Redis.from_url(os.environ["REDIS_URL"])
    reconnections = []
    pubsub = PUBSUBS[path](client, lambda: reconnections.append(1))
    try:
        for channel in ("one", "two"):
            await pubsub.subscribe(channel)
            await read_until(pubsub, "subscribe")
        redis_client.publish("one", "before")
        assert (await read_until(pubsub, "message"))[-1]["data"] == b"before"
        assert reconnections == []

        assert redis_client.client_kill_filter(_type="pubsub") == 1
        read = await read_until(pubsub, "subscribe")  # redis-py reconnects and resubscribes
        read += await read_until(pubsub, "subscribe")
        assert sorted(m["channel"] for m in read if m["type"] == "subscribe") == [b"one", b"two"]
        assert reconnections == [1]

        await pubsub.unsubscribe("one")
        await read_until(pubsub, "unsubscribe")
        await pubsub.subscribe("three")  # a subscription of ours, not a reconnection
        await read_until(pubsub, "subscribe")
        redis_client.publish("two", "after")
        assert (await read_until(pubsub, "message"))[-1]["data"] == b"after"
        assert reconnections == [1] and pubsub.subscribed
    finally:
        await pubsub.aclose()
        await client.aclose()


def two_slots_of(cluster, node_name):
    """Two channels of different slots that this master owns."""
    channels, slots = [], set()
    n = 0
    while len(channels) < 2:
        n += 1
        channel = f"shard-{n}"
        slot = cluster.keyslot(channel)
        if cluster.get_node_from_key(channel).name == node_name and slot not in slots:
            channels.append(channel)
            slots.add(slot)
    return channels


@pytest.mark.parametrize("path", PATHS)
async def test_shard_channels_of_several_slots_after_a_reconnection(cluster, path):
    """The fast path subscribes them again one SSUBSCRIBE each; redis-py's own PubSub sends one
    SSUBSCRIBE of all, which the node refuses (CROSSSLOT): the hub recovers from that error by
    subscribing each again (gateway.hub), as the second half does here."""
    node = cluster.get_primaries()[0]
    channels = two_slots_of(cluster, node.name)
    client = aioredis.Redis(host=node.host, port=node.port)
    reconnections = []
    pubsub = PUBSUBS[path](client, lambda: reconnections.append(1))
    try:
        for channel in channels:
            await pubsub.ssubscribe(channel)
            await read_until(pubsub, "ssubscribe")
        with redis.Redis(host=node.host, port=node.port) as direct:
            assert direct.client_kill_filter(_type="pubsub") == 1
        if path == "internals":
            read = await read_until(pubsub, "ssubscribe")
            read += await read_until(pubsub, "ssubscribe")
            assert sorted(m["channel"] for m in read) == sorted(c.encode() for c in channels)
        else:
            with pytest.raises(ResponseError):  # CROSSSLOT
                await read_until(pubsub, "ssubscribe")
            for channel in channels:
                await pubsub.ssubscribe(channel)
                await read_until(pubsub, "ssubscribe")
        assert reconnections == [1]
        cluster.spublish(channels[1], "after")
        assert (await read_until(pubsub, "smessage"))[-1]["data"] == b"after"
    finally:
        await pubsub.aclose()
        await client.aclose()


IN_RANGE = {"redis": (8, 1, 0), "celery": (5, 6, 3), "kombu": (5, 7, 0)}
DECIDE = {"eventbus.redis": redis_adapter.decide, "eventbus.celery": celery_adapter.decide}


@pytest.fixture
def releases():
    """The installed releases as the gate reads them (in the tested range until changed); the
    decisions taken at import are asked again after."""
    found = dict(IN_RANGE)
    with pytest.MonkeyPatch.context() as patched:
        patched.delenv(exactly_once.internals.ENVIRONMENT_VARIABLE, raising=False)
        patched.setattr(exactly_once.internals, "installed", found.get)
        yield found
    for decide in DECIDE.values():
        decide()


@pytest.mark.parametrize(
    "distribution, release, adapter",
    [
        ("redis", (8, 2, 0), "eventbus.redis"),
        ("redis", (5, 0, 0), "eventbus.redis"),
        ("redis", None, "eventbus.redis"),  # not installed
        ("celery", (5, 7, 1), "eventbus.celery"),
        ("celery", (5, 3, 6), "eventbus.celery"),
        ("kombu", (5, 8, 0), "eventbus.celery"),
        ("kombu", (5, 3, 3), "eventbus.celery"),
    ],
)
def test_the_gate_takes_the_public_api_outside_the_tested_range(releases, distribution, release, adapter):
    assert DECIDE[adapter]()
    assert exactly_once.internals.adapters_in_use()[adapter] == "internals"
    releases[distribution] = release
    assert not DECIDE[adapter]()
    assert exactly_once.internals.adapters_in_use()[adapter] == "public API"


def test_the_environment_forces_the_public_api(releases):
    assert redis_adapter.decide() and celery_adapter.decide()
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv(exactly_once.internals.ENVIRONMENT_VARIABLE, "off")
        assert not redis_adapter.decide() and not celery_adapter.decide()
    decisions = exactly_once.internals.adapters_in_use()
    assert decisions["eventbus.redis"] == decisions["eventbus.celery"] == "public API"


def test_the_path_bound_at_import_is_the_one_decided():
    fast = redis_adapter.INTERNALS
    assert exactly_once.internals.adapters_in_use()["eventbus.redis"] == (
        "internals" if fast else "public API"
    )
    assert redis_adapter.run_scripts is (redis_adapter._run_internals if fast else redis_adapter._run_public)
    assert redis_adapter.pubsub_for is (
        redis_adapter._tracked_pubsub if fast else redis_adapter._PublicPubSub
    )


@pytest.fixture
def unguarded(monkeypatch):
    """AsynPool as Celery ships it for the test (restored after)."""
    from celery.concurrency.asynpool import AsynPool

    track = AsynPool._track_child_process
    monkeypatch.setattr(AsynPool, "_track_child_process", getattr(track, "__wrapped__", track))
    return AsynPool


def test_the_celery_guard_skips_a_pool_process_that_exited(unguarded):
    from kombu.asynchronous import Hub

    pool = SimpleNamespace(_event_process_exit=lambda *args: None)
    gone = SimpleNamespace(_sentinel_poll=None)  # its exit handled, not joined yet
    read_end, write_end = os.pipe()
    alive = SimpleNamespace(_sentinel_poll=read_end)
    hub = Hub()
    try:
        # The crash the guard is for, in the releases installed: kombu cannot add a None fd and
        # Celery does not catch what it raises.
        with pytest.raises((ValueError, AttributeError)):
            unguarded._track_child_process(pool, gone, hub)
        assert celery_adapter.skip_exited_pool_processes()
        assert celery_adapter.skip_exited_pool_processes()  # once: not wrapped twice
        assert unguarded._track_child_process.__wrapped__.__name__ == "_track_child_process"
        assert not hasattr(unguarded._track_child_process.__wrapped__, "__wrapped__")
        assert unguarded._track_child_process(pool, gone, hub) is None
        unguarded._track_child_process(pool, alive, hub)  # a live process is tracked as before
        assert read_end in hub.readers
    finally:
        hub.close()
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize("taken", [True, False])
def test_the_celery_guard_waits_for_a_worker_and_only_in_the_range(unguarded, monkeypatch, taken):
    """connect() (EventbusConfig.ready()) hooks the guard on worker_init, in the range only; the
    signal itself is not sent here: Celery's Django fixup would set up this process as a worker."""
    from celery.signals import worker_init

    connected = worker_init.disconnect(dispatch_uid=celery_adapter.NAME)  # by EventbusConfig.ready()
    assert connected is celery_adapter.INTERNALS
    monkeypatch.setattr(celery_adapter, "INTERNALS", taken)
    try:
        celery_adapter.connect()
        assert worker_init.disconnect(dispatch_uid=celery_adapter.NAME) is taken
        assert not getattr(unguarded._track_child_process, "skips_exited", False)
        celery_adapter._on_worker_init(sender=None)
        assert unguarded._track_child_process.skips_exited
    finally:
        if connected:
            worker_init.connect(celery_adapter._on_worker_init, weak=False, dispatch_uid=celery_adapter.NAME)
