"""Every script of the bus on a real 3-master Redis Cluster: all keys of a call share the slot
of their {domain:shard} tag, so nothing fails with CROSSSLOT."""

from io import StringIO

from django.core.management import call_command

from eventbus import publish_event, publish_events
from eventbus.delivery import streams_for
from eventbus.keys import JobKeys
from eventbus.reclaimer import Reclaimer
from eventbus.redis import get_redis
from eventbus.router import Router

from .helpers import Subscriber, dead_letters, history_seqs, pending, state

JOBS = [("scan", f"cj{n}") for n in range(8)] + [("chat", f"cc{n}") for n in range(8)]


def test_the_streams_spread_over_the_three_masters(cluster):
    nodes = {cluster.get_node_from_key(stream.key).name for stream in streams_for()}
    assert len(nodes) == 3
    assert type(get_redis()).__name__ == "RedisCluster"


def test_publish_route_reclaim_dead_letter_and_redrive_on_the_cluster(cluster):
    subscriber = Subscriber(cluster.get_random_node().redis_connection)  # PUBLISH reaches every node
    assert publish_event("scan", "cj0", "vision", 10, {"n": 0}) is True
    assert publish_event("scan", "cj0", "vision", 10, {"n": 0}) is False
    assert publish_events([(d, j, "vision", 10, {}) for d, j in JOBS]) == [False] + [True] * (len(JOBS) - 1)
    publish_events([(d, j, "vision", 11, {}) for d, j in JOBS])

    # A router that read everything and died: the reclaimer (async cluster client) settles it.
    dead = Router(consumer="dead")
    dead.ensure_groups()
    assert len(dead.read({s.key: ">" for s in streams_for()}, None)) == 2 * len(JOBS)
    Reclaimer(burst=True, min_idle_ms=0).run()
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
    subscriber.close()


def test_scripts_are_loaded_again_on_every_master_after_a_flush(cluster, redis_cluster_nodes):
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
