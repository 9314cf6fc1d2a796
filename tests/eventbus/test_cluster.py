"""Every script of the bus on a real 3-master Redis Cluster: all keys of a call share the slot
of their {domain:shard} tag, so nothing fails with CROSSSLOT; the router publishes with
SPUBLISH, which only the shard's master carries (no broadcast to every node)."""

from io import StringIO

import pytest
import redis
from django.core.management import call_command

from eventbus import publish_event, publish_events
from eventbus.bus.delivery import streams_for
from eventbus.bus.keys import JobKeys
from eventbus.bus.reclaimer import Reclaimer
from eventbus.bus.router import Router
from eventbus.redis.clients import get_redis

from .helpers import ShardSubscriber, Subscriber, dead_letters, history_seqs, pending, state

JOBS = [("scan", f"cj{n}") for n in range(8)] + [("chat", f"cc{n}") for n in range(8)]


def test_the_streams_spread_over_the_three_masters(cluster):
    nodes = {cluster.get_node_from_key(stream.key).name for stream in streams_for()}
    assert len(nodes) == 3
    assert type(get_redis()).__name__ == "RedisCluster"


def test_publish_route_reclaim_dead_letter_and_redrive_on_the_cluster(cluster, redis_cluster_nodes):
    subscriber = ShardSubscriber(cluster, [JobKeys(d, j).channel for d, j in JOBS])
    # Classic subscribers on every node hear nothing: SPUBLISH is not copied across the cluster.
    broadcast = [Subscriber(redis.Redis(port=node.port)) for node in redis_cluster_nodes]
    assert publish_event("scan", "cj0", "vision", 10, {"n": 0}) is True
    assert publish_event("scan", "cj0", "vision", 10, {"n": 0}) is False
    assert publish_events([(d, j, "vision", 10, {}) for d, j in JOBS]) == [False] + [True] * (len(JOBS) - 1)
    publish_events([(d, j, "vision", 11, {}) for d, j in JOBS])

    # A router that read everything and died: the reclaimer (async cluster client) settles it.
    dead = Router(consumer="dead")
    dead.ensure_groups()
    assert len(dead.read({s.key: ">" for s in streams_for()}, None)) == 2 * len(JOBS)
    reclaim_until_settled(cluster)
    for domain, job in JOBS:
        assert history_seqs(cluster, domain, job) == [10, 11]
    assert sorted(e["seq"] for e in subscriber.receive(2 * len(JOBS))) == [10] * len(JOBS) + [11] * len(JOBS)

    # The router (pipelined per-stream reads on the cluster), a poison entry and a gap.
    publish_events([(d, j, "vision", seq, {}) for seq in (12, 13) for d, j in JOBS])
    keys = JobKeys("chat", "cc3")
    cluster.xadd(keys.stream, {"job_id": "cc3", "data": "{"})
    [lost] = [
        (i, f) for i, f in cluster.xrange(keys.stream) if f.get(b"seq") == b"12" and f[b"job_id"] == b"cc3"
    ]
    cluster.xdel(keys.stream, lost[0])
    Router(burst=True, consumer="r1").run()
    assert history_seqs(cluster, "chat", "cc3") == [10, 11]
    assert history_seqs(cluster, "scan", "cj5") == [10, 11, 12, 13]
    Reclaimer(burst=True, min_idle_ms=0, max_deliveries=1).run()
    reasons = sorted(letter["reason"] for letter in dead_letters(cluster, "chat", keys.shard))
    assert reasons == ["missing field(s): domain, stage, seq, prev_seq", "predecessor seq 12 never applied"]

    cluster.xadd(keys.stream, lost[1])
    Router(burst=True, consumer="r1").run()
    out = StringIO()
    call_command("eventbus_redrive", domain="chat", stdout=out)
    assert "re-drove 1 of 2" in out.getvalue()
    Router(burst=True, consumer="r1").run()
    assert history_seqs(cluster, "chat", "cc3") == [10, 11, 12, 13]
    assert state(cluster, "chat", "cc3")["seq"] == 13
    assert all(pending(cluster, s.key) == 0 for s in streams_for())
    assert len(subscriber.receive(4 * len(JOBS))) == 4 * len(JOBS)  # 10-13 of every job, once
    assert all(b.drain() == [] for b in broadcast)
    subscriber.close()
    for b in broadcast:
        b.close()


def reclaim_until_settled(cluster, passes: int = 3) -> None:
    """Reclaimer passes until nothing is pending: an entry whose script call failed (a
    connection lost under the machine's load, logged at WARNING) is left pending for the next
    pass, as in production."""
    for _ in range(passes):
        Reclaimer(burst=True, min_idle_ms=0).run()
        if all(pending(cluster, s.key) == 0 for s in streams_for()):
            return
    raise AssertionError(f"still pending after {passes} reclaimer passes")


def test_the_processes_refuse_a_cluster_master_older_than_redis_7(cluster):
    from django.core.exceptions import ImproperlyConfigured

    from eventbus.redis.durability import check_cluster_version, too_old_for_cluster

    check_cluster_version(cluster, process="test")  # the suite's servers: 7.x
    assert too_old_for_cluster({"a:1": {"redis_version": "7.0.15"}, "b:2": {"redis_version": "6.2.14"}}) == [
        "b:2 runs Redis 6.2.14"
    ]

    class OldServers:
        def info(self, section, target_nodes=None):
            return {"127.0.0.1:7001": {"redis_version": "6.2.6"}}

    with pytest.raises(ImproperlyConfigured, match=r"needs Redis >= 7.0 .* 127.0.0.1:7001 runs Redis 6.2.6"):
        check_cluster_version(OldServers(), process="router")


def test_scripts_are_loaded_again_on_every_master_after_a_flush(cluster, redis_cluster_nodes, db):
    """(`db`: a reclaimer pass that fails and is retried closes stale database connections first,
    as its loop does in production.)"""
    import redis

    publish_event("scan", "warm", "vision", 10, {})
    for node in redis_cluster_nodes:
        with redis.Redis(port=node.port) as client:
            client.script_flush()
    assert publish_events([(d, j, "vision", 10, {}) for d, j in JOBS]) == [True] * len(JOBS)
    for node in redis_cluster_nodes:
        with redis.Redis(port=node.port) as client:
            client.script_flush()
    Reclaimer(burst=True, min_idle_ms=0).run()  # nothing pending yet: only NOGROUP
    Router(burst=True, consumer="r1").run()
    assert all(history_seqs(cluster, d, j) == [10] for d, j in JOBS)
