"""One Redis pub/sub connection per gateway process, multiplexed over every socket.

Sockets register a listener per job channel; the hub subscribes a channel when its first
listener arrives and unsubscribes it when the last one leaves. Redis connections stay O(1)
in sockets: one for pub/sub, at most GATEWAY['READ_CONNECTIONS'] for history reads. When Redis drops the connection, redis-py reconnects and resubscribes;
messages published meanwhile are lost on pub/sub, so the hub then asks every listener to
resync (backfill from the job's history), and nothing is lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from typing import Protocol

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub

from eventbus.durability import check_durability
from eventbus.redis import get_redis, make_async_node_client, make_async_read_client

from .backoff import Backoff, retrying
from .conf import gateway_settings

logger = logging.getLogger(__name__)
# Redis is away for now (a restart, a failover, a dropped connection): try again.
REDIS_AWAY: tuple[type[BaseException], ...] = (aioredis.ConnectionError, aioredis.TimeoutError, OSError)
REDIS_AWAY_OR_RACED: tuple[type[BaseException], ...] = (*REDIS_AWAY, RuntimeError)  # see add()


class Listener(Protocol):
    def deliver(self, raw: bytes, event: dict) -> None: ...

    def resync(self) -> None: ...


class _TrackedPubSub(PubSub):
    """A PubSub that tells its hub about every (re)connection."""

    hub: Hub

    async def on_connect(self, connection):
        await super().on_connect(connection)
        self.hub._connected()


class Hub:
    def __init__(self):
        # The pub/sub connection has a client of its own; reads (history, state) share a small
        # blocking pool (eventbus.redis builds both).
        self._redis = make_async_node_client()
        self._reads = make_async_read_client(max_connections=gateway_settings.READ_CONNECTIONS)
        self._pubsub = _TrackedPubSub(self._redis.connection_pool, ignore_subscribe_messages=False)
        self._pubsub.hub = self
        self._listeners: dict[str, set[Listener]] = {}
        self._confirmed: dict[str, asyncio.Event] = {}
        self.reconnections = 0
        self._reader: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._durability: asyncio.Task | None = None

    async def check_durability(self) -> None:
        """The bus's Redis checked once per process, at the first socket (eventbus.durability):
        a warning in the log, or ImproperlyConfigured for every socket when refused by setting."""
        if self._durability is None:
            # The bus's own check, once, off the event loop: no async twin of it to keep in step.
            self._durability = asyncio.ensure_future(
                asyncio.to_thread(check_durability, get_redis(), process="gateway")
            )
        await asyncio.shield(self._durability)

    @property
    def redis(self) -> aioredis.Redis:
        """A client for reads (history, state)."""
        return self._reads

    @property
    def channels(self) -> int:
        return len(self._listeners)

    async def add(self, channel: str, listener: Listener) -> None:
        """Register `listener`; returns once the channel's subscription is live, so a read
        of the history made afterwards misses nothing published later. While Redis is away
        it waits for it (the socket stays open, as on a reconnect), however long that takes."""
        # RuntimeError: the reader task was re-establishing the pub/sub connection when SUBSCRIBE
        # came, and both read its socket (asyncio refuses a second reader). Seen in the chaos run
        # after a Redis restart; the next try succeeds.
        await retrying(
            lambda: self._add(channel, listener),
            (*REDIS_AWAY_OR_RACED, TimeoutError),
            f"gateway hub: cannot subscribe {channel}",
            logger,
        )

    async def _add(self, channel: str, listener: Listener) -> None:
        async with self._lock:
            listeners = self._listeners.setdefault(channel, set())
            listeners.add(listener)
            if len(listeners) == 1:
                self._confirmed[channel] = asyncio.Event()
                try:
                    await self._pubsub.subscribe(channel)
                except BaseException:
                    # Not subscribed: the next try (or the next listener) subscribes again.
                    del self._listeners[channel]
                    self._confirmed.pop(channel, None)
                    raise
                if self._reader is None or self._reader.done():
                    self._reader = asyncio.create_task(self._read(), name="gateway-hub-reader")
            confirmed = self._confirmed[channel]
        # A reconnection meanwhile subscribes again, and the reader confirms it then.
        await asyncio.wait_for(confirmed.wait(), gateway_settings.SUBSCRIBE_TIMEOUT)

    async def remove(self, channel: str, listener: Listener) -> None:
        async with self._lock:
            listeners = self._listeners.get(channel)
            if not listeners:
                return
            listeners.discard(listener)
            if not listeners:
                del self._listeners[channel]
                self._confirmed.pop(channel, None)
                try:
                    await self._pubsub.unsubscribe(channel)
                except REDIS_AWAY:
                    pass  # the reconnect resubscribes only what is still listened to

    def _connected(self) -> None:
        # redis-py calls this on every reconnection (a pooled connection is handed out already
        # connected, so not for the first). Whatever was published meanwhile is in the history.
        self.reconnections += 1
        logger.warning("gateway hub reconnected to Redis; resyncing %d channel(s)", len(self._listeners))
        for listeners in list(self._listeners.values()):
            for listener in list(listeners):
                listener.resync()

    async def _read(self) -> None:
        backoff = Backoff()
        while self._listeners or self._pubsub.subscribed:
            try:
                message = await self._pubsub.get_message(timeout=1.0)
                backoff.reset()
            except REDIS_AWAY_OR_RACED:
                # redis-py retried and gave up; the next read reconnects (and on_connect resyncs).
                # RuntimeError: a SUBSCRIBE was re-establishing the connection as we read (see add).
                logger.warning("gateway hub lost Redis; retrying in %.2f s", backoff.delay)
                await backoff.wait()
                continue
            if message is None:
                continue
            channel = message["channel"].decode()
            if message["type"] == "message":
                listeners = list(self._listeners.get(channel, ()))
                if listeners:
                    try:
                        event = json.loads(message["data"])  # once, whatever the sockets on the channel
                        event["seq"]
                    except (ValueError, TypeError, KeyError):
                        # Not the router's: nobody else may stop the stream of every socket.
                        logger.warning("gateway hub: ignored a message on %s that is not an event", channel)
                        continue
                    for listener in listeners:
                        listener.deliver(message["data"], event)
            elif message["type"] == "subscribe" and channel in self._confirmed:
                self._confirmed[channel].set()

    async def close(self) -> None:
        if self._reader:
            self._reader.cancel()
        await self._pubsub.aclose()
        await self._reads.aclose()
        await self._redis.aclose()


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def get_hub() -> Hub:
    """The hub of the running event loop (one per process under daphne)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = Hub()
    return hub


async def close_hub() -> None:
    """Close the running loop's hub (tests; a process's hub otherwise lives as long as it)."""
    hub = _hubs.pop(asyncio.get_running_loop(), None)
    if hub is not None:
        await hub.close()
