"""Helpers of the event bus tests: reading what the router and the jobs wrote, and pointing this
process's Celery app at a broker. Processes and polling are in tests/processes.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import contextmanager

import redis

from config import celery_app
from config.redis_server import free_port
from eventbus.bus.keys import JobKeys
from eventbus.testing import events_of
from tests.processes import wait_for


def history(client, domain: str, job_id: str, after: int = 0) -> list[dict]:
    """The job's history entries with seq > after, in seq order (as the gateway reads it)."""
    key = JobKeys(domain, job_id).history
    return [json.loads(member) for member in client.zrange(key, f"({after}", "+inf", byscore=True)]


def history_seqs(client, domain: str, job_id: str) -> list[int]:
    return [event["seq"] for event in history(client, domain, job_id)]


def state(client, domain: str, job_id: str) -> dict | None:
    raw = client.get(JobKeys(domain, job_id).state)
    return json.loads(raw) if raw else None


def dead_letters(client, domain: str, shard: int | None = None) -> list[dict]:
    from eventbus.bus.keys import dead_letter_key
    from eventbus.jobtypes import shard_count

    shards = range(shard_count(domain)) if shard is None else [shard]
    return [
        {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
        for s in shards
        for _id, fields in client.xrange(dead_letter_key(domain, s))
    ]


def pending(client, key: str, group: str = "router") -> int:
    try:
        return client.xpending(key, group)["pending"]
    except Exception as exc:  # no stream or group yet
        if "NOGROUP" in str(exc):
            return 0
        raise


def job_ids_on_shard(domain: str, shard: int, count: int, prefix: str = "job") -> list[str]:
    """Job ids whose keys fall on this shard (to aim entries at one stream)."""
    found: list[str] = []
    n = 0
    while len(found) < count:
        job_id = f"{prefix}-{n}"
        if JobKeys(domain, job_id).shard == shard:
            found.append(job_id)
        n += 1
    return found


def shard_subscribers(cluster, channel: str) -> int:
    """SHARDNUMSUB of a shard channel, asked of the master that owns it."""
    node = cluster.get_node_from_key(channel)
    with redis.Redis(host=node.host, port=node.port) as client:
        return int(client.pubsub_shardnumsub(channel)[0][1])


class Subscriber:
    """A pub/sub client on every job channel (pattern), subscribed before anything is published."""

    def __init__(self, client, pattern: str = "*:channel:*"):
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe(pattern)
        wait_for(
            lambda: self.pubsub.subscribed and client.execute_command("PUBSUB NUMPAT") >= 1,
            message="the pattern subscription",
        )
        self.events: list[dict] = []

    def receive(self, count: int, timeout: float = 20) -> list[dict]:
        """Wait until `count` events in all arrived; return them all."""

        def enough():
            while (message := self._next(timeout=0.01)) is not None:
                self.events.append(json.loads(message["data"]))
            return len(self.events) >= count

        wait_for(enough, timeout=timeout, interval=0, message=f"{count} published events")
        return self.events

    def _next(self, timeout: float):
        return self.pubsub.get_message(timeout=timeout)

    def drain(self, quiet: float = 0.2) -> list[dict]:
        """Everything that arrives until nothing did for `quiet` seconds."""
        quiet_until = time.monotonic() + quiet
        while time.monotonic() < quiet_until:
            # None also for the (ignored) subscribe confirmation: only data restarts the window.
            message = self._next(timeout=0.02)
            if message is not None:
                self.events.append(json.loads(message["data"]))
                quiet_until = time.monotonic() + quiet
        return self.events

    def close(self):
        self.pubsub.close()


class ShardSubscriber(Subscriber):
    """SSUBSCRIBE to these shard channels of a Redis Cluster, each on the master that owns it
    (redis-py's ClusterPubSub), subscribed before anything is published."""

    def __init__(self, cluster, channels: list[str]):
        self.pubsub = cluster.pubsub(ignore_subscribe_messages=True)
        self.pubsub.ssubscribe(*channels)
        wait_for(
            lambda: all(shard_subscribers(cluster, channel) == 1 for channel in channels),
            message="the shard channel subscriptions",
        )
        self.events: list[dict] = []

    def _next(self, timeout: float):
        return self.pubsub.get_sharded_message(timeout=timeout)


def job_events(client, domain: str, job_id) -> list[tuple[str, int]]:
    """(stage, seq) of every entry of the job in its shard stream, in stream order."""
    job_id = str(job_id)
    entries = client.xrange(JobKeys(domain, job_id).stream)
    return [
        (fields[b"stage"].decode(), int(fields[b"seq"]))
        for _id, fields in entries
        if fields[b"job_id"].decode() == job_id
    ]


def expected_events(domain: str, payload: dict | None = None) -> list[tuple[str, int]]:
    return [(stage, seq) for stage, seq, _data in events_of(domain, payload)]


def queued_task_ids(client, queue: str = "celery") -> list[str]:
    """Ids of the task messages waiting in a Celery queue on the Redis broker, newest first
    (the reverse of the order a worker takes them). kombu keeps each priority band in a list of
    its own (the queue's name for band 0, the name, kombu's separator and the band for the
    others), and a job's priority picks the band (eventbus.tasks.broker_priority: 0, the
    default, is band 3)."""
    from kombu.transport.redis import PRIORITY_STEPS, Channel

    keys = [queue if band == 0 else f"{queue}{Channel.sep}{band}" for band in reversed(PRIORITY_STEPS)]
    return [json.loads(message)["headers"]["id"] for key in keys for message in client.lrange(key, 0, -1)]


def point_broker(url: str) -> None:
    """Point the Celery app of this process at another broker (drop its pooled connections)."""
    celery_app.conf.broker_url = url
    # The app reads Django's settings under namespace="CELERY": Celery 5.6 reads the namespaced
    # key before the plain one, so both are set.
    celery_app.conf.CELERY_BROKER_URL = url
    celery_app._pool = None  # kombu keeps a pool per broker: the old one is reused on the way back
    celery_app.amqp._producer_pool = None


@contextmanager
def broker_down():
    """The broker is unreachable: a port nothing listens on."""
    previous = celery_app.conf.broker_url
    point_broker(f"redis://127.0.0.1:{free_port()}/0")
    try:
        yield
    finally:
        point_broker(previous)


def wait_for_job_state(
    job_id, state: str, logs: Callable[[], str], *, timeout: float = 60, what: str = "job"
):
    """The job once it is in `state`; what `logs()` gives (its processes' logs) in the failure."""
    from eventbus.models import Job

    def reached():
        return Job.objects.get(pk=job_id).state == state

    try:
        wait_for(reached, timeout=timeout, interval=0.05, message=f"{what} {job_id} to be {state}")
    except AssertionError:
        job = Job.objects.get(pk=job_id)
        raise AssertionError(f"{what} {job_id} is {job.state}, not {state}; logs:\n{logs()}") from None
    return Job.objects.get(pk=job_id)
