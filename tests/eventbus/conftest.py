"""Event bus fixtures: a real 3-master Redis Cluster (started on first use, once per session),
settings that point the bus at it, a Celery broker on the test Redis and operations to run."""

import os
import random
import socket
import time

import pytest
import redis
from django.conf import settings
from django.test.utils import override_settings

from config.redis_server import RedisServer

from .helpers import point_broker

CLUSTER_ARGS = (
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "2000",
)
SLOTS = 16384


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000, before Redis 7's --cluster-port) is free too."""
    for _ in range(200):
        port = random.randint(20000, 55535)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


def _create_cluster(nodes: list[RedisServer]) -> None:
    """Slots split evenly, every node met: what `redis-cli --cluster create --cluster-replicas 0`
    does, through redis-py so that it needs no redis-cli (CLUSTER ADDSLOTS exists since 3.0)."""
    clients = [redis.Redis(port=node.port) for node in nodes]
    try:
        step = SLOTS // len(nodes)
        for i, client in enumerate(clients):
            end = SLOTS if i == len(nodes) - 1 else (i + 1) * step
            client.execute_command("CLUSTER ADDSLOTS", *range(i * step, end))
        for client in clients[1:]:
            client.execute_command("CLUSTER MEET", "127.0.0.1", nodes[0].port)
        deadline = time.monotonic() + 30
        while not all(
            client.cluster("info").get("cluster_state") == "ok" and len(client.cluster("nodes")) == len(nodes)
            for client in clients
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.05)
    finally:
        for client in clients:
            client.close()


@pytest.fixture(scope="session")
def redis_cluster_nodes():
    nodes = []
    try:
        for _ in range(3):
            nodes.append(RedisServer(port=_cluster_port(), args=CLUSTER_ARGS).start())
        _create_cluster(nodes)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture
def cluster(redis_cluster_nodes):
    """The bus on the cluster (EVENTBUS['CLUSTER']); every master flushed. Yields a RedisCluster."""
    from redis.cluster import RedisCluster

    for node in redis_cluster_nodes:
        with redis.Redis(port=node.port) as client:
            client.flushall()
    eventbus = {**getattr(settings, "EVENTBUS", {}), "CLUSTER": True}
    with override_settings(REDIS_URL=redis_cluster_nodes[0].url, EVENTBUS=eventbus):
        client = RedisCluster.from_url(redis_cluster_nodes[0].url)
        yield client
        client.close()


@pytest.fixture
def eventbus_settings_override():
    """override_settings(EVENTBUS=...) on top of the test settings' EVENTBUS."""

    def override(**values):
        return override_settings(EVENTBUS={**getattr(settings, "EVENTBUS", {}), **values})

    return override


@pytest.fixture
def broker(redis_client, redis_url):
    """The Celery app of this process publishes to the test Redis (flushed: no queued tasks)."""
    point_broker(redis_url)
    return redis_client


@pytest.fixture
def make_operation(user):
    from idempotency.models import Operation

    def make(domain="scan", payload=None, **fields):
        return Operation.objects.create(
            scope=f"t:{user.pk}", idem_key=fields.pop("idem_key", os.urandom(8).hex()), owner=user,
            domain=domain, event_type="job.requested", payload=payload or {}, **fields,
        )

    return make
