"""One Redis pub/sub connection per gateway process (per master on a Redis Cluster),
multiplexed over every socket.

Sockets register a listener per job channel; the hub subscribes a channel when its first
listener arrives and unsubscribes it when the last one leaves. Redis connections stay O(1)
in sockets: one for pub/sub (on a cluster, one per master that owns a channel listened to: the
router publishes with SPUBLISH and the hub listens with SSUBSCRIBE), at most
GATEWAY['READ_CONNECTIONS'] for history reads. When Redis drops a connection, redis-py
reconnects and resubscribes; messages published meanwhile are lost on pub/sub, so the hub then
asks the listeners of that connection to resync (backfill from the job's history), and nothing
is lost. On a cluster, a channel whose slot moved (a failover, a resharding) is subscribed again
on its new master, then resynced.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis

from eventbus.pubsub import (
    check_durability,
    cluster_client,
    node_client,
    pubsub_for,
    read_client,
    refresh_slot_map,
)
from eventbus.selectors import Backfill, read_backfills
from exactly_once.tracing import TRACING, extract, span

from .backoff import Backoff, retrying
from .conf import gateway_settings
from .gcpause import full_collections_held_until
from .loops import PerLoop

logger = logging.getLogger(__name__)
# Redis is away for now (a restart, a failover, a dropped connection): try again.
REDIS_AWAY: tuple[type[BaseException], ...] = (aioredis.ConnectionError, aioredis.TimeoutError, OSError)
# Reads of the slot map before one that names a node that is no master is believed anyway
# (about 1.5 s with the backoff).
REHOME_TRIES = 6
READ_BATCH = 100  # jobs' history reads pipelined in one round trip
REDIS_AWAY_OR_RACED: tuple[type[BaseException], ...] = (*REDIS_AWAY, RuntimeError)  # see add()


def untraced(raw: bytes | str) -> bytes | str:
    """A channel message without the trace context a tracing router appended as its last member
    (eventbus.bus.events): the event JSON as the history holds it, to the byte."""
    if isinstance(raw, bytes):
        return raw[: raw.rindex(b',"tp":')] + b"}"
    return raw[: raw.rindex(',"tp":')] + "}"


class Frame:
    """One event as every socket of its job sends it: parsed, decoded and wrapped in its ASGI
    message once, whatever the number of sockets."""

    __slots__ = ("event", "message", "prev_seq", "seq")

    def __init__(self, raw: bytes | str, event: dict):
        self.event = event
        self.seq: int = event["seq"]
        self.prev_seq: int = event.get("prev_seq", 0)
        if type(self.seq) is not int or type(self.prev_seq) is not int:
            raise TypeError("an event's seq and prev_seq are integers")
        # One dict for every socket: servers read an ASGI message, they do not keep or change it.
        self.message = {"type": "websocket.send", "text": raw if isinstance(raw, str) else raw.decode()}


@dataclass(frozen=True, slots=True)
class History:
    """A job's backfill (eventbus.selectors.Backfill) as frames."""

    frames: list[Frame]  # seq > the asker's last seq, in seq order
    applied: int | None
    latest: dict | None


class Listener(Protocol):
    domain: str
    job_id: str
    last_sent: int  # the seq of the last event it sent
    live: bool  # True: it sends what it is handed at once; False: it catches up on its own

    def deliver(self, frame: Frame) -> None: ...

    def resync(self) -> None:
        """Catch up from the history on its own (it reads it, with retries)."""

    def resynced(self, history: History) -> None:
        """The job's history after the lowest last seq of the job's live listeners."""


class _Line:
    """One pub/sub connection and the task that reads it: the hub's only one on a single server
    (classic SUBSCRIBE), or, on a Redis Cluster, one per master that owns a channel listened to
    (SSUBSCRIBE: the router's SPUBLISH reaches that master alone)."""

    def __init__(self, hub: Hub, client: aioredis.Redis, name: str, *, sharded: bool):
        self.hub, self.client, self.name, self.sharded = hub, client, name, sharded
        # redis-py reconnects and subscribes the channels again; the hub then resyncs them
        # (eventbus.pubsub.pubsub_for tells it of the reconnection).
        self.pubsub = pubsub_for(client, functools.partial(hub._connected, self))
        self.channels: set[str] = set()  # subscribed through this line (or being)
        self.reader: asyncio.Task | None = None

    async def subscribe(self, channel: str) -> None:
        self.channels.add(channel)
        try:
            await (self.pubsub.ssubscribe if self.sharded else self.pubsub.subscribe)(channel)
        except BaseException:
            self.channels.discard(channel)
            raise
        if self.reader is None or self.reader.done():
            self.reader = asyncio.create_task(self._read(), name=f"gateway-hub-reader {self.name}")

    async def unsubscribe(self, channel: str) -> None:
        self.channels.discard(channel)  # first: the sunsubscribe that comes back is ours
        try:
            await (self.pubsub.sunsubscribe if self.sharded else self.pubsub.unsubscribe)(channel)
        except REDIS_AWAY:
            pass  # the reconnect resubscribes only what is still listened to

    async def _read(self) -> None:
        backoff = Backoff()
        while self.channels or self.pubsub.subscribed:
            try:
                # Blocking (timeout=None): a read with a timeout arms and cancels an event-loop
                # timer for every message (4-5 us of the 11 us a message costs, more with the
                # thousands of sockets' timers in the heap). Nothing needs a wake-up without one:
                # the last UNSUBSCRIBE's confirmation ends the loop, and close() cancels it.
                message = await self.pubsub.get_message(timeout=None)
                backoff.reset()
            except REDIS_AWAY_OR_RACED:
                # redis-py retried and gave up; the next read reconnects (and on_connect resyncs).
                # RuntimeError: a SUBSCRIBE was re-establishing the connection as we read (see add).
                logger.warning("gateway hub lost Redis (%s); retrying in %.2f s", self.name, backoff.delay)
                await self._recover(backoff)
                continue
            except aioredis.RedisError as exc:
                # An error reply (a resubscription refused by a node that no longer owns the
                # slot, MOVED, or of shard channels of several slots, CROSSSLOT): the reader must
                # not die with it, or its sockets hear nothing more.
                logger.error("gateway hub: %s on %s; resubscribing and resyncing", exc, self.name)
                await self._recover(backoff, resync=True)
                continue
            if message is not None:
                self.hub._on_message(self, message)

    async def _recover(self, backoff: Backoff, *, resync: bool = False) -> None:
        await backoff.wait()
        if self.sharded:
            # The master may be gone for good (a failover): its channels move to theirs.
            await self.hub._rehome(list(self.channels), force=resync)
        elif resync:
            self.hub._resync(self.channels)

    async def close(self) -> None:
        if self.reader:
            self.reader.cancel()
        await self.pubsub.aclose()
        await self.client.aclose()


class _SharedRead:
    """A history read asked for and not yet sent, and the lowest seq its askers have."""

    __slots__ = ("after", "domain", "job_id", "result")

    def __init__(self, domain: str, job_id: str, after: int):
        self.domain, self.job_id, self.after = domain, job_id, after
        self.result: asyncio.Future[History] = asyncio.get_running_loop().create_future()

    def settle(self, read: Backfill | BaseException) -> None:
        if self.result.done():
            return
        try:
            if isinstance(read, BaseException):
                raise read
            self.result.set_result(
                History([Frame(raw, event) for raw, event in read.entries], read.applied, read.latest)
            )
        except Exception as exc:  # this job's history only: each asker fails as after a failed read
            self.result.set_exception(exc)
            self.result.exception()  # retrieved here: its askers may all have left

    def history_after(self, after: int, history: History) -> History:
        """The read's history for an asker whose last seq is `after` (others asked from lower)."""
        if self.after == after:
            return history
        return History([f for f in history.frames if f.seq > after], history.applied, history.latest)


class Hub:
    def __init__(self):
        # Reads (history, state) share a small blocking pool (eventbus.pubsub builds it); each
        # pub/sub line has a client of its own.
        self._reads = read_client(max_connections=gateway_settings.READ_CONNECTIONS)
        # On a Redis Cluster, a cluster client tells which master owns a channel's slot.
        self._cluster = cluster_client()
        self._lines: dict[str, _Line] = {}
        self._line_of: dict[str, _Line] = {}  # channel -> the line it is subscribed through
        self._listeners: dict[str, set[Listener]] = {}
        self._confirmed: dict[str, asyncio.Event] = {}
        self.reconnections = 0
        self._lock = asyncio.Lock()
        self._durability: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # channels following their slot to a new master
        # History reads not yet sent, by channel: the sockets of a job that ask meanwhile share one.
        self._reads_waiting: dict[str, _SharedRead] = {}
        self._readers = 0  # tasks sending them, one connection each at most

    async def check_durability(self) -> None:
        """The bus's Redis checked once per process, at the first socket (eventbus.pubsub):
        a warning in the log, or ImproperlyConfigured for every socket when refused by setting."""
        if self._durability is None:
            # The bus's own check, once, off the event loop: no async twin of it to keep in step.
            self._durability = asyncio.ensure_future(asyncio.to_thread(check_durability, process="gateway"))
        await asyncio.shield(self._durability)

    @property
    def redis(self) -> aioredis.Redis:
        """A client for reads (history, state)."""
        return self._reads

    @property
    def channels(self) -> int:
        return len(self._listeners)

    @property
    def lines(self) -> int:
        """Pub/sub connections (1 on a single server; on a cluster, the masters listened to)."""
        return len(self._lines)

    async def backfill(self, channel: str, domain: str, job_id: str, *, after: int) -> History:
        """The job's history after seq `after` (eventbus.selectors), read once for all the job's
        sockets that ask before the read is sent, and sent with up to READ_BATCH other jobs'
        reads in one round trip: after a Redis blip every socket of the process resyncs at once,
        and 5,000 sockets on 1,000 jobs cost ten round trips, not 5,000. A read joins only one
        not yet sent, so it never misses an event published before it asked."""
        shared = self._ask(channel, domain, job_id, after)
        return shared.history_after(after, await asyncio.shield(shared.result))

    def _ask(self, channel: str, domain: str, job_id: str, after: int) -> _SharedRead:
        """The read of the job's history not yet sent, joined or made, and a task to send it."""
        shared = self._reads_waiting.get(channel)
        if shared is None:
            shared = self._reads_waiting[channel] = _SharedRead(domain, job_id, after)
            if self._readers < gateway_settings.READ_CONNECTIONS:
                self._readers += 1
                task = asyncio.get_running_loop().create_task(self._send_reads())
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        shared.after = min(shared.after, after)
        return shared

    async def _send_reads(self) -> None:
        """Send the reads waiting, READ_BATCH a round trip, until none wait (one of at most
        READ_CONNECTIONS such tasks, each on a connection of its own)."""
        batch: list[_SharedRead] = []
        try:
            while self._reads_waiting:
                # Taken: from here on, a new ask for one of these jobs waits for a new read.
                batch = [self._reads_waiting.pop(next(iter(self._reads_waiting)))]
                while self._reads_waiting and len(batch) < READ_BATCH:
                    batch.append(self._reads_waiting.pop(next(iter(self._reads_waiting))))
                try:
                    reads = await read_backfills(self._reads, [(r.domain, r.job_id, r.after) for r in batch])
                except Exception as exc:
                    for shared in batch:
                        shared.settle(exc)  # each asker retries as after any failed read
                    continue
                for shared, read in zip(batch, reads):
                    shared.settle(read)
        except asyncio.CancelledError:
            # Not the askers' own cancellation: they retry, as after a lost connection.
            for shared in batch:
                shared.settle(aioredis.ConnectionError("the gateway hub is closing"))
            raise
        finally:
            self._readers -= 1

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
                    await self._subscribe(channel)
                except BaseException:
                    # Not subscribed: the next try (or the next listener) subscribes again.
                    del self._listeners[channel]
                    self._confirmed.pop(channel, None)
                    raise
            confirmed = self._confirmed[channel]
        # A reconnection meanwhile subscribes again, and the reader confirms it then.
        await asyncio.wait_for(confirmed.wait(), gateway_settings.SUBSCRIBE_TIMEOUT)

    async def _subscribe(self, channel: str) -> None:
        line = await self._line_for(channel)
        await line.subscribe(channel)
        self._line_of[channel] = line

    async def _line_for(self, channel: str) -> _Line:
        if self._cluster is None:
            name, sharded = "redis", False
        else:
            await self._cluster.initialize()  # the slot map, once (a no-op after)
            node = self._cluster.get_node_from_key(channel)
            name, sharded = node.name, True
        line = self._lines.get(name)
        if line is None:
            client = node_client(node.host, node.port) if sharded else node_client()
            line = self._lines[name] = _Line(self, client, name, sharded=sharded)
        return line

    async def remove(self, channel: str, listener: Listener) -> None:
        async with self._lock:
            listeners = self._listeners.get(channel)
            if not listeners:
                return
            listeners.discard(listener)
            if not listeners:
                del self._listeners[channel]
                self._confirmed.pop(channel, None)
                line = self._line_of.pop(channel, None)
                if line is not None:
                    await line.unsubscribe(channel)

    def _connected(self, line: _Line) -> None:
        # After every reconnection of the line (not the first connection: a pooled connection is
        # handed out already connected). Whatever was published meanwhile is in the history.
        self.reconnections += 1
        logger.warning(
            "gateway hub reconnected to Redis (%s); resyncing %d channel(s)", line.name, len(line.channels)
        )
        self._resync(line.channels)

    def _resync(self, channels) -> None:
        """What was published while a line was away is in the history: each job's live
        listeners share one read of it (itself batched with other jobs'), and a listener that
        is catching up reads it again on its own. The reads' results are handed over in
        callbacks, not a task per job: after a blip, thousands of jobs resync at once, and the
        cyclic GC's full collections wait until they all are (gateway.gcpause)."""
        reads = []
        for channel in list(channels):
            live = []
            for listener in list(self._listeners.get(channel, ())):
                if listener.live:
                    live.append(listener)
                else:
                    listener.resync()
            if live:
                after = min(listener.last_sent for listener in live)
                shared = self._ask(channel, live[0].domain, live[0].job_id, after)
                shared.result.add_done_callback(
                    functools.partial(self._resynced, channel, live, after, shared)
                )
                reads.append(shared.result)
        full_collections_held_until(reads)

    @staticmethod
    def _resynced(channel: str, listeners: list[Listener], after: int, shared: _SharedRead, result) -> None:
        exc = result.exception()
        if exc is not None:
            # Redis away again, or a history that cannot be read: each listener tries on its own
            # (with retries, or its failure).
            logger.info(
                "gateway hub: the history of %s unread (%r); its sockets resync on their own", channel, exc
            )
            for listener in listeners:
                listener.resync()
            return
        history = shared.history_after(after, result.result())
        for listener in listeners:
            listener.resynced(history)

    def _on_message(self, line: _Line, message: dict) -> None:
        channel = message["channel"].decode()
        kind = message["type"]
        if kind in ("message", "smessage"):
            listeners = list(self._listeners.get(channel, ()))
            if listeners:
                try:
                    # Once, whatever the sockets on the channel.
                    raw = message["data"]
                    event = json.loads(raw)
                    # A tracing router's trace context, the message's last member: never sent on
                    # (whether this process traces or not), the frame is the event as stored.
                    traceparent = event.pop("tp", None)
                    if traceparent is not None:
                        raw = untraced(raw)
                    frame = Frame(raw, event)
                except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                    # Not the router's: nobody else may stop the stream of every socket.
                    logger.warning("gateway hub: ignored a message on %s that is not an event", channel)
                    return
                if TRACING and traceparent is not None:
                    with span(
                        "gateway.frame",
                        extract(traceparent),
                        job_id=str(event.get("job_id", "")),
                        domain=str(event.get("domain", "")),
                        seq=frame.seq,
                        sockets=len(listeners),
                    ):
                        for listener in listeners:
                            listener.deliver(frame)
                    return
                for listener in listeners:
                    listener.deliver(frame)
        elif kind in ("subscribe", "ssubscribe") and channel in self._confirmed:
            self._confirmed[channel].set()
        elif kind == "sunsubscribe" and channel in line.channels:
            # Not ours: the channel's slot moved to another master, which Redis tells its
            # subscribers so. Follow it there (and never resubscribe it on this line).
            line.channels.discard(channel)
            line.pubsub.forget(message["channel"])
            task = asyncio.get_running_loop().create_task(self._rehome([channel]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _rehome(self, channels: list[str], *, force: bool = False) -> None:
        """Cluster: refresh the slot map and subscribe each channel still listened to on the
        master that owns it now (a failover, a slot moved), then resync its sockets from the
        history: what was published meanwhile went to a connection that no longer hears it.
        With `force`, channels that stay on their master are subscribed and resynced again too.

        A slot map read at once may not know of a failover yet (the node asked learns of it a
        moment later) and name the demoted master: a channel subscribed there (a replica now,
        which takes the SSUBSCRIBE) would hear nothing. So each master the map names is asked
        its ROLE, and the map is read again, a few times, until they all are masters."""
        assert self._cluster is not None
        backoff = Backoff()
        for attempt in range(REHOME_TRIES):
            try:
                await refresh_slot_map(self._cluster)
            except REDIS_AWAY as exc:
                logger.warning("gateway hub: the cluster's slot map could not be read (%s)", exc)
                if attempt == REHOME_TRIES - 1:
                    return
            else:
                nodes = {self._cluster.get_node_from_key(channel).name: channel for channel in channels}
                if attempt == REHOME_TRIES - 1 or all([await self._is_master(c) for c in nodes.values()]):
                    break
            await backoff.wait()
        moved = []
        async with self._lock:
            for channel in channels:
                if channel not in self._listeners:
                    continue
                old = self._line_of.get(channel)
                new = await self._line_for(channel)
                if new is old and channel in old.channels and not force:
                    continue
                if old is not None and old is not new:
                    old.channels.discard(channel)
                    old.pubsub.forget(channel)
                try:
                    await new.subscribe(channel)
                except REDIS_AWAY_OR_RACED as exc:
                    logger.warning("gateway hub: cannot subscribe %s on %s yet (%s)", channel, new.name, exc)
                    continue
                self._line_of[channel] = new
                moved.append(channel)
            for name, line in list(self._lines.items()):
                if not line.channels and line not in self._line_of.values():
                    del self._lines[name]
                    asyncio.get_running_loop().create_task(line.close())
        if moved:
            logger.warning("gateway hub: %d channel(s) moved to their new master; resyncing", len(moved))
            self._resync(moved)

    async def _is_master(self, channel: str) -> bool:
        """Whether the node the slot map names for this channel says it is a master."""
        assert self._cluster is not None
        node = self._cluster.get_node_from_key(channel)
        try:
            role = await self._cluster.execute_command("ROLE", target_nodes=node)
        except REDIS_AWAY:
            return False  # gone: a failover is under way
        return bool(role) and role[0] in (b"master", "master")

    async def close(self) -> None:
        for line in self._lines.values():
            await line.close()
        await self._reads.aclose()
        if self._cluster is not None:
            await self._cluster.aclose()


_hubs: PerLoop[Hub] = PerLoop(lambda: Hub(), lambda hub: hub.close())


def get_hub() -> Hub:
    """The hub of the running event loop (one per process under daphne)."""
    return _hubs.get()


async def close_hub() -> None:
    """Close the running loop's hub (tests; a process's hub otherwise lives as long as it)."""
    await _hubs.close()
