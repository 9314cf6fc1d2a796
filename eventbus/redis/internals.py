"""redis-py's internals behind one gate (docs/design/adapters.md): the bus's script round trips, the cluster's
slot map and the gateway's pub/sub.

Internals used, and why:

- Script calls written on a raw connection: the calls are packed (hiredis' `pack_command`, else
  `Connection.pack_commands`), sent in one `Connection.send_packed_command` and their replies read
  with `Connection.read_response`; the router's next XREADGROUP goes ahead of them in the same
  write and its raw reply is parsed while Redis runs the scripts. What a redis-py pipeline does
  for one server, minus its per-command bookkeeping: a third of the publisher's time in the
  benchmark (bench/REPORT-eventbus.md). On a cluster each node gets its calls in one such write
  on one of its connections (`ClusterNode.redis_connection`): redis-py's cluster pipeline asked
  one node COMMAND GETKEYS for every EVALSHA, a round trip each, and that node did 0.6-0.7 of
  the cluster's work (bench/cluster.py, bench/REPORT-cluster.md).
- A connection each thread keeps checked out of its pool (`ConnectionPool.get_connection` and
  `release`, `Connection.can_read` and `disconnect`): redis-py's check-out and return around
  every command (a pid check, a lock, a readiness poll and its metrics) cost ~6 us, as much
  Python as all the rest of a single publish.
- NOSCRIPT handled by hand: EVALSHA alone, and a script loaded only when a server answers
  NOSCRIPT (a restart, a failover, SCRIPT FLUSH); redis-py's Script objects add SCRIPT EXISTS
  to every pipeline, one more round trip per batch.
- The cluster's slot map read again at once: `RedisCluster.nodes_manager.initialize()` after the
  bus moved slots, or when the gateway follows a channel to its new master, and
  `nodes_manager.get_node_from_slot()`.
- The gateway's pub/sub: a `PubSub` subclass overriding `on_connect`, which redis-py calls after
  every reconnection: the hub hears of it at once and resyncs the line's sockets, and shard
  channels are resubscribed one SSUBSCRIBE each (redis-py sends them all in one, which a cluster
  node refuses, CROSSSLOT, unless they share a slot). A channel whose slot moved is dropped from
  `PubSub.shard_channels`, so that no reconnection subscribes it where it no longer lives.

Tested range: redis-py 6.1 up to, not including, 8.2 (the version matrix's oldest and newest).

Fallback (outside that range, or EXACTLY_ONCE_INTERNALS=off), the public API only:

- script calls in `client.pipeline(transaction=False)` through the scripts' `Script` objects
  (`register_script`), which load what a server lacks before the pipeline runs (SCRIPT EXISTS,
  one more round trip per batch); `execute(raise_on_error=False)` gives each call's error. A
  cluster's pipeline refuses Script objects (redis-py blocks EVALSHA there): its calls go as
  EVALSHA commands and one that meets NOSCRIPT runs again through its Script on the cluster
  client, which loads it. No read ahead goes with the calls (a pipeline parses every reply): the
  router reads its next batch on its own, one more round trip a batch. No connection is held;
- the slot map: a sync cluster client follows each moved slot by a command on a key of it (the
  MOVED it gets updates its map); the gateway's async cluster client is closed and initialized
  again, which reads the map anew; a slot's node is the one of a key in that slot;
- pub/sub: redis-py's own `PubSub`. A reconnection shows in what it reads: redis-py subscribes
  the channels again, and the first confirmation of a new connection counts 1 while channels
  were confirmed on the last one. A cluster node refuses a resubscription of shard channels of
  several slots (CROSSSLOT), or of one that moved (MOVED): the hub's reader meets that error and
  subscribes every channel again on the master that owns it, then resyncs (gateway.hub).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.asyncio.client import PubSub
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    ResponseError,
    TryAgainError,
)

from eventbus.redis.clients import by_node, is_cluster
from exactly_once.internals import internals

try:
    from hiredis import pack_command
except ImportError:  # pragma: no cover - redis[hiredis] is a requirement
    pack_command = None  # type: ignore[assignment]  # redis-py packs the commands itself

NAME = "eventbus.redis"
DISTRIBUTION = "redis"
LOWEST, BELOW = "6.1", "8.2"


def decide() -> bool:
    """Whether redis-py's internals are used (asked once, at import: the names below are bound
    to the path taken)."""
    return internals(NAME, DISTRIBUTION, LOWEST, BELOW)


INTERNALS = decide()


# Held connections (internals) ---------------------------------------------------------------
#
# A thread that runs scripts keeps the connection it took from the pool:
# - it goes back to its pool when the thread ends (or the thread moves to another client: new
#   settings, another node of a cluster), so a thread per request leaks nothing;
# - used again after more than IDLE_CHECK seconds, it is first checked the way the pool checks
#   (data or EOF waiting: the server closed it, or a reply was left unread) and reconnected;
# - a child process forgets its parent's (the socket is the parent's);
# - after an error mid round trip it is disconnected (a reply may be left unread), and
#   reconnects when used.

IDLE_CHECK = 1.0


class _Slot:
    """One thread's connection; handed back to its pool when the thread's slot goes."""

    __slots__ = ("pool", "connection", "used", "__weakref__")

    def __init__(self, pool, connection):
        self.pool, self.connection, self.used = pool, connection, time.monotonic()
        weakref.finalize(self, _release, pool, connection)


def _release(pool, connection) -> None:
    try:
        pool.release(connection)
    except Exception:  # pragma: no cover - a pool closed meanwhile: nothing to give back
        pass


_local = threading.local()


def _forget_after_fork() -> None:
    global _local
    _local = threading.local()  # not released: the parent still uses those connections


os.register_at_fork(after_in_child=_forget_after_fork)


def connection_of(pool):
    """This thread's connection of `pool`, connected and ready to send."""
    slot = getattr(_local, "slot", None)
    if slot is not None and slot.pool is pool:
        now = time.monotonic()
        connection = slot.connection
        if now - slot.used > IDLE_CHECK:
            try:
                if connection.can_read():
                    connection.disconnect()
            except Exception:  # redis' ConnectionError, an OSError...: a new connection will tell
                connection.disconnect()
        slot.used = now
        return connection
    _local.slot = None  # gives the previous one back to its pool
    connection = pool.get_connection()
    _local.slot = _Slot(pool, connection)
    return connection


# Script calls: internals --------------------------------------------------------------------
#
# `calls` are eventbus.bus.scripts.ScriptCall: .script (.source, .sha), .keys, .args and .command
# (the EVALSHA). Each reply is a value or the ResponseError of its call.

# Calls per write of a batch (see _send_and_read).
SEND_CHUNK = 8

# A call a node did not take: its slot lives elsewhere now, or the node is away.
REDIRECTED = (MovedError, AskError, TryAgainError, ClusterDownError)


def _send_and_read(client, calls: Sequence, then: tuple = (), first: tuple = ()) -> list:
    """One write of all the calls (and the command `then`, if any) and their replies, on this
    thread's connection of the client's pool (connection_of), or one from a Sentinel's pool.

    `first`, a (command, on_reply) pair: the command goes ahead of the calls in the same write,
    and its raw reply (or its error) goes to on_reply as soon as it is read, while Redis runs
    the calls.
    """
    pool = client.connection_pool
    # Sentinel's pool moves its idle connections to a new master; one held would stay behind.
    hold = type(pool) is redis.ConnectionPool
    connection = connection_of(pool) if hold else pool.get_connection()
    lead, on_lead = first or ((), None)
    try:
        if pack_command is not None and len(calls) == 1 and not (lead or then):
            # One call (a worker's single publish): nothing to chunk.
            connection.send_packed_command((pack_command(calls[0].command),))
            return [_read_reply(connection)]
        if pack_command is not None:
            # In chunks: Redis runs the first calls while the next are built and packed.
            for start in range(0, len(calls), SEND_CHUNK):
                chunk = [pack_command(call.command) for call in calls[start : start + SEND_CHUNK]]
                if lead and not start:
                    chunk.insert(0, pack_command(lead))
                if then and start + SEND_CHUNK >= len(calls):
                    chunk.append(pack_command(then))
                connection.send_packed_command([b"".join(chunk)])
        else:
            commands = ([lead] if lead else []) + [call.command for call in calls] + ([then] if then else [])
            connection.send_packed_command(connection.pack_commands(commands))
        if lead:
            on_lead(_read_reply(connection))
        return [_read_reply(connection) for _ in range(len(calls) + bool(then))]
    except BaseException:
        connection.disconnect()  # replies may be left unread: never reuse it as it is
        raise
    finally:
        if not hold:
            pool.release(connection)


def _read_reply(connection):
    try:
        return connection.read_response()
    except ResponseError as exc:
        return exc


def _execute_on_cluster(client, calls: Sequence) -> list:
    """Each node gets its calls in one write on one of its connections (_send_and_read), by the
    slot of each call's first key (all of a call's keys share it). Calls a node redirects
    (MOVED, ASK: a slot that moved; TRYAGAIN, CLUSTERDOWN) or could not take (connection lost)
    go through redis-py's cluster pipeline, which follows redirections and refreshes the slot
    map."""
    results: list = [None] * len(calls)
    again: list[int] = []
    for node, indexes in by_node(client, [call.keys[0] for call in calls]):
        try:
            replies = _send_and_read(node.redis_connection, [calls[i] for i in indexes])
        except (redis.ConnectionError, redis.TimeoutError):
            again.extend(indexes)  # the scripts are idempotent: a call that ran runs as a duplicate
            continue
        for i, reply in zip(indexes, replies):
            if isinstance(reply, REDIRECTED):
                again.append(i)
            else:
                results[i] = reply
    if again:
        pipe = client.pipeline(transaction=False)
        for i in again:
            pipe.execute_command(*calls[i].command)
        for i, reply in zip(again, pipe.execute(raise_on_error=False)):
            results[i] = reply
    return results


def _acknowledged(first, then):
    """Of two WAIT replies, the one that says less: an error, else the fewer replicas."""
    if isinstance(first, Exception):
        return first
    if isinstance(then, Exception):
        return then
    return min(first, then)


def _run_internals(client, calls: Sequence, then: tuple = (), first: tuple = ()) -> list:
    if type(client) is redis.Redis:
        replies = _send_and_read(client, calls, then, first)
    else:
        replies = _execute_on_cluster(client, calls)
    todo = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if todo:
        # A server that does not know a script: load it (through the client, which reaches
        # every primary of a cluster) and run the refused calls again, in their order.
        for script in {calls[i].script for i in todo}:
            client.script_load(script.source)
        retried = [calls[i] for i in todo]
        again = (
            _send_and_read(client, retried, then)
            if type(client) is redis.Redis
            else _execute_on_cluster(client, retried)
        )
        for i, reply in zip(todo, again):
            replies[i] = reply
        if then:
            replies[-1] = _acknowledged(replies[-1], again[-1])
    return replies


async def _arun_internals(client, calls: Sequence) -> list:
    results: list = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            # execute_command: redis-py's cluster pipeline blocks its evalsha() method, though
            # it routes EVALSHA by its keys like any command, which is all a one-slot script needs.
            pipe.execute_command(*calls[i].command)
        for i, result in zip(todo, await pipe.execute(raise_on_error=False)):
            results[i] = result
        todo = [i for i in todo if isinstance(results[i], NoScriptError)]
        if not todo or attempt:
            return results
        for script in {calls[i].script for i in todo}:
            await client.script_load(script.source)
    return results


# Script calls: the public API ---------------------------------------------------------------

# eventbus.bus.scripts.LuaScript's sha -> its redis-py Script (AsyncScript), registered once with the
# first client that runs it; every call names its client (or pipeline).
_scripts: dict[str, Any] = {}
_async_scripts: dict[str, Any] = {}


def _script_of(client, script):
    registered = _scripts.get(script.sha)
    if registered is None:
        registered = _scripts[script.sha] = client.register_script(script.source)
    return registered


def _async_script_of(client, script):
    registered = _async_scripts.get(script.sha)
    if registered is None:
        registered = _async_scripts[script.sha] = client.register_script(script.source)
    return registered


def _run_public(client, calls: Sequence, then: tuple = (), first: tuple = ()) -> list:
    """`first` is not sent (redis-py's pipeline parses every reply; the caller reads on its own)."""
    if is_cluster(client):
        pipe = client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call.command)  # EVALSHA: see _arun_internals
        replies = pipe.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                replies[i] = _call_script(_script_of(client, calls[i].script), calls[i], client)
        return replies
    todo = list(range(len(calls)))
    replies = [None] * (len(calls) + bool(then))
    for _attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            _script_of(client, calls[i].script)(calls[i].keys, calls[i].args, client=pipe)
        if then:
            pipe.execute_command(*then)
        results = pipe.execute(raise_on_error=False)
        for i, reply in zip(todo, results):
            replies[i] = reply
        if then:
            replies[-1] = results[-1] if replies[-1] is None else _acknowledged(replies[-1], results[-1])
        # Loaded before the pipeline ran (SCRIPT EXISTS, SCRIPT LOAD); flushed meanwhile, run again.
        todo = [i for i in todo if isinstance(replies[i], NoScriptError)]
        if not todo:
            break
    return replies


def _call_script(script, call, client):
    try:
        return script(call.keys, call.args, client=client)
    except ResponseError as exc:
        return exc


async def _acall_script(script, call, client):
    try:
        return await script(call.keys, call.args, client=client)
    except ResponseError as exc:
        return exc


async def _arun_public(client, calls: Sequence) -> list:
    pipe = client.pipeline(transaction=False)
    if is_cluster(client):
        for call in calls:
            pipe.execute_command(*call.command)  # EVALSHA: see _arun_internals
    else:
        for call in calls:
            await _async_script_of(client, call.script)(call.keys, call.args, client=pipe)
    replies = await pipe.execute(raise_on_error=False)
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            replies[i] = await _acall_script(_async_script_of(client, calls[i].script), calls[i], client)
    return replies


# run_scripts(client, calls, then=(), first=()): the calls in one round trip, each reply a value or
# its call's ResponseError; with `then` (a command), its reply last. NOSCRIPT is handled.
# arun_scripts(client, calls): the same for a redis.asyncio client.
run_scripts: Callable[..., list] = _run_internals if INTERNALS else _run_public
arun_scripts: Callable[..., Any] = _arun_internals if INTERNALS else _arun_public


# The cluster's slot map -----------------------------------------------------------------------

# slot -> a key of that slot (the public path finds a slot's node by a key of it), and the
# numbers of the keys tried so far.
_keys_of_slots: dict[int, str] = {}
_tried = itertools.count()


def key_in_slot(client, slot: int) -> str:
    """A key whose slot is `slot`, found by trying short keys with the client's keyslot() (some
    16,000 tries for the first slot asked, fewer after: every key tried is remembered)."""
    key = _keys_of_slots.get(slot)
    while key is None:
        candidate = f"eventbus-slot-{next(_tried)}"
        _keys_of_slots.setdefault(client.keyslot(candidate), candidate)
        key = _keys_of_slots.get(slot)
    return key


def _node_of_slot_internals(client, slot: int):
    return client.nodes_manager.get_node_from_slot(slot)


def _node_of_slot_public(client, slot: int):
    return client.get_node_from_key(key_in_slot(client, slot))


def _follow_moved_slots_internals(client, slots) -> None:
    client.nodes_manager.initialize()


def _follow_moved_slots_public(client, slots) -> None:
    for slot in slots:
        client.exists(key_in_slot(client, slot))  # MOVED: the client maps the slot to its new master


async def _refresh_slot_map_internals(client) -> None:
    await client.nodes_manager.initialize()


async def _refresh_slot_map_public(client) -> None:
    await client.aclose()  # its connections; the next initialize() reads the cluster's layout again
    await client.initialize()


# node_of_slot(client, slot): the node that owns the slot, as a sync cluster client's map says.
# follow_moved_slots(client, slots): the client maps these slots (moved by us) to their new owners.
# refresh_slot_map(client): an async cluster client reads the cluster's slot map again.
node_of_slot: Callable[..., Any] = _node_of_slot_internals if INTERNALS else _node_of_slot_public
follow_moved_slots: Callable[..., None] = (
    _follow_moved_slots_internals if INTERNALS else _follow_moved_slots_public
)
refresh_slot_map: Callable[..., Any] = _refresh_slot_map_internals if INTERNALS else _refresh_slot_map_public


# Pub/sub --------------------------------------------------------------------------------------


class _TrackedPubSub(PubSub):
    """A PubSub that calls on_reconnect() after every reconnection (not the first connection: a
    pooled connection is handed out already connected)."""

    on_reconnect: Callable[[], None]

    async def on_connect(self, connection):
        # redis-py resubscribes every shard channel in one SSUBSCRIBE, which a cluster refuses
        # unless they share a slot (CROSSSLOT): one command per channel instead.
        sharded = self.shard_channels
        if not sharded:
            await super().on_connect(connection)
            self.on_reconnect()
            return
        self.shard_channels = {}
        try:
            await super().on_connect(connection)
            for channel in sharded:
                await self.ssubscribe(channel)
        finally:
            self.shard_channels = {**sharded, **self.shard_channels}
        self.on_reconnect()

    def forget(self, channel: str | bytes) -> None:
        """A shard channel Redis unsubscribed (its slot moved): never subscribed here again."""
        self.shard_channels.pop(channel if isinstance(channel, bytes) else channel.encode(), None)


def _tracked_pubsub(client, on_reconnect: Callable[[], None]) -> _TrackedPubSub:
    pubsub = _TrackedPubSub(client.connection_pool, ignore_subscribe_messages=False)
    pubsub.on_reconnect = on_reconnect
    return pubsub


_CONFIRMATIONS = frozenset(("subscribe", "ssubscribe"))


def _encoded(channel: str | bytes) -> bytes:
    return channel if isinstance(channel, bytes) else channel.encode()


class _PublicPubSub:
    """redis-py's PubSub, its public methods only, telling on_reconnect() of a reconnection from
    what it reads: the first subscription confirmed on a new connection counts 1, and a
    reconnection makes redis-py subscribe every channel again."""

    def __init__(self, client, on_reconnect: Callable[[], None]):
        self.pubsub = client.pubsub(ignore_subscribe_messages=False)
        self.on_reconnect = on_reconnect
        self.confirmed: set[bytes] = set()  # confirmed on the connection as last heard

    @property
    def subscribed(self) -> bool:
        return self.pubsub.subscribed

    async def subscribe(self, channel: str) -> None:
        self.confirmed.discard(_encoded(channel))  # its confirmation is ours, not a resubscription
        await self.pubsub.subscribe(channel)

    async def ssubscribe(self, channel: str) -> None:
        self.confirmed.discard(_encoded(channel))
        await self.pubsub.ssubscribe(channel)

    async def unsubscribe(self, channel: str) -> None:
        self.confirmed.discard(_encoded(channel))
        await self.pubsub.unsubscribe(channel)

    async def sunsubscribe(self, channel: str) -> None:
        self.confirmed.discard(_encoded(channel))
        await self.pubsub.sunsubscribe(channel)

    def forget(self, channel: str | bytes) -> None:
        # The node would answer SUNSUBSCRIBE with MOVED; redis-py keeps the channel and subscribes
        # it again at a reconnection, which the node refuses: the hub's reader recovers then.
        self.confirmed.discard(_encoded(channel))

    async def get_message(self, ignore_subscribe_messages: bool = False, timeout: float | None = 0.0):
        message = await self.pubsub.get_message(ignore_subscribe_messages, timeout)
        if message is not None and message["type"] in _CONFIRMATIONS:
            if message["data"] == 1 and self.confirmed:
                self.confirmed.clear()
                self.on_reconnect()
            self.confirmed.add(_encoded(message["channel"]))
        return message

    async def aclose(self) -> None:
        await self.pubsub.aclose()


# pubsub_for(client, on_reconnect): a PubSub of a redis.asyncio client of one server (subscribe,
# ssubscribe, unsubscribe, sunsubscribe, get_message, subscribed, aclose, and forget(channel))
# that calls on_reconnect() after redis-py reconnected it and subscribed its channels again.
pubsub_for: Callable[..., Any] = _tracked_pubsub if INTERNALS else _PublicPubSub
