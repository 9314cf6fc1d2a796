"""Event bus fixtures: a real 3-master Redis Cluster (started on first use, once per session),
settings that point the bus at it, a Celery broker on the test Redis and operations to run."""

import os

import pytest
import redis
from django.conf import settings
from django.test.utils import override_settings

from config.redis_server import RedisClusterServers

from .helpers import point_broker


@pytest.fixture(scope="session")
def redis_cluster_nodes():
    servers = RedisClusterServers(3).start()
    yield servers.nodes
    servers.stop()


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
            scope=f"t:{user.pk}",
            idem_key=fields.pop("idem_key", os.urandom(8).hex()),
            owner=user,
            domain=domain,
            event_type="job.requested",
            payload=payload or {},
            **fields,
        )

    return make
