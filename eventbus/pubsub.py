"""The event bus's pub/sub face: what a subscriber to jobs' live events needs, in one module.

The router publishes each event it applies on the job's channel; a subscriber (the gateway's
hub and its WebSocket consumers) listens there, and catches up from the job's history
(`eventbus.selectors.read_backfills`) after a gap or a reconnection. What it needs of the bus
is here, each a thin public function or name over the bus's own modules: the asyncio clients it
subscribes and reads with, a pub/sub that tells of reconnections, the cluster's slot map read
again, the durability check at start, the job's channel name (from `eventbus.bus.keys`, where every
key is named), the highest seq an event may carry, and how long Redis keeps a job's events. A
subscriber imports these and nothing else of the bus's Redis plumbing, so that plumbing can move
without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventbus.bus.events import MAX_SEQ, MAX_SEQ_DIGITS
from eventbus.bus.keys import JobKeys
from eventbus.conf import eventbus_settings
from eventbus.redis import internals as _adapter
from eventbus.redis.clients import get_redis, make_async_node_client, make_async_read_client, make_async_redis
from eventbus.redis.durability import check_durability as _check_durability

__all__ = [
    "MAX_SEQ",
    "MAX_SEQ_DIGITS",
    "check_durability",
    "cluster_client",
    "events_kept_seconds",
    "job_channel",
    "node_client",
    "pubsub_for",
    "read_client",
    "refresh_slot_map",
]

# MAX_SEQ: the highest seq an event may carry (2**53, what every JSON reader holds exactly);
# MAX_SEQ_DIGITS: its length in decimal digits, to refuse a longer number before parsing it.


def job_channel(domain: str, job_id: str) -> str:
    """The pub/sub channel the router publishes the job's events on.

    Parameters
    ----------
    domain : str
        The job's type (its `domain` on the wire and in the key texts).
    job_id : str
        The job's id.
    """
    return JobKeys(domain, job_id).channel


def read_client(*, max_connections: int):
    """A redis.asyncio client for many concurrent short reads (history, state): at most
    `max_connections` connections, a burst of readers queueing for one (eventbus.redis).

    Parameters
    ----------
    max_connections : int
        The most connections it opens (on a single server; a cluster's or Sentinel's client
        keeps its own pools).
    """
    return make_async_read_client(max_connections=max_connections)


def cluster_client():
    """A redis.asyncio cluster client, which tells the master that owns a channel's slot, on a
    Redis Cluster (EVENTBUS["CLUSTER"]); None otherwise. The caller closes it."""
    return make_async_redis() if eventbus_settings.CLUSTER else None


def node_client(host: str | None = None, port: int | None = None):
    """A plain redis.asyncio client of one server, for a pub/sub connection: the one REDIS_URL
    names (or the master its sentinels name), or a cluster's node.

    Parameters
    ----------
    host, port : str, int, optional
        A cluster node's address (with REDIS_URL's credentials); None: REDIS_URL's server.
    """
    return make_async_node_client(host, port)


def pubsub_for(client, on_reconnect: Callable[[], None]) -> Any:
    """A pub/sub of `client` (subscribe, ssubscribe, unsubscribe, sunsubscribe, get_message,
    subscribed, aclose, and forget(channel)) that calls `on_reconnect()` after redis-py
    reconnected it and subscribed its channels again: what was published meanwhile is lost on
    pub/sub, and the subscriber catches up from the history then.

    Parameters
    ----------
    client : redis.asyncio.Redis
        A client of one server (node_client()).
    on_reconnect : callable
        Called with no argument after each reconnection (not the first connection).
    """
    return _adapter.pubsub_for(client, on_reconnect)


async def refresh_slot_map(client) -> None:
    """Read the cluster's slot map again (a failover, a slot moved), so that the client names
    the master that owns each channel's slot now.

    Parameters
    ----------
    client : redis.asyncio.cluster.RedisCluster
        The cluster client (cluster_client()).
    """
    await _adapter.refresh_slot_map(client)


def check_durability(*, process: str) -> list[str]:
    """Check the bus's Redis once at a subscriber's start (eventbus.redis.durability): the problems
    found, logged as warnings, or ImproperlyConfigured when EVENTBUS["REDIS_DURABILITY"] is
    "refuse". Blocking: run it off the event loop.

    Parameters
    ----------
    process : str
        What the log lines name as the process that checked (e.g. "gateway").
    """
    return _check_durability(get_redis(), process=process)


def events_kept_seconds() -> int:
    """How long Redis keeps a job's events, at least: the shorter of its latest event's and its
    history's TTL (EVENTBUS["STATE_TTL"], EVENTBUS["HISTORY_TTL"]). A job older than this may
    have no event left in Redis."""
    return min(eventbus_settings.STATE_TTL, eventbus_settings.HISTORY_TTL)
