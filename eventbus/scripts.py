"""The Lua scripts of the bus, read once from eventbus/lua/ and run by SHA (EVALSHA).

A server that does not know a script (restart, failover, SCRIPT FLUSH) answers NOSCRIPT: the
script is loaded then and the refused calls run again, in their order. Loading through the
client also reaches every primary of a cluster.

A script that finds one of its keys holding the wrong type (or a seq key holding no seq) writes
nothing and answers "CORRUPT <key> ...": that reply comes back as CorruptKey, naming the key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from importlib import resources

import redis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    ResponseError,
    TryAgainError,
)

from . import held
from .redis import by_node

try:
    from hiredis import pack_command
except ImportError:  # pragma: no cover - redis[hiredis] is a requirement
    pack_command = None  # type: ignore[assignment]  # redis-py packs the commands itself


class CorruptKey(ResponseError):
    """A script found one of its keys holding the wrong type, or a seq key holding no seq, and
    wrote nothing. The message names the key; the call succeeds once the key is repaired."""


def classified(result):
    """A script's error reply as CorruptKey when it says CORRUPT; any other result as it is."""
    if isinstance(result, ResponseError) and str(result).startswith("CORRUPT "):
        return CorruptKey(str(result))
    return result


class LuaScript:
    def __init__(self, name: str):
        self.name = name
        folder = resources.files("eventbus") / "lua"
        # Redis scripts cannot import: the checks every script shares are prepended.
        self.source = (folder / "_prelude.lua").read_text() + (folder / f"{name}.lua").read_text()
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def __repr__(self):
        return f"<LuaScript {self.name} {self.sha[:8]}>"

    def call(self, keys: Sequence, args: Sequence) -> ScriptCall:
        return ScriptCall(self, keys, args)

    def call_later(self, build: Callable[[], tuple[Sequence, Sequence]]) -> ScriptCall:
        """A call whose (keys, args) `build` returns when it is sent (see ScriptCall)."""
        return ScriptCall(self, None, None, build)


class ScriptCall:
    """One call of a script. Its keys and arguments may come from `build`, called when the call
    is sent: a batch goes out in chunks (_send_and_read), and building the next chunk overlaps
    Redis running the last."""

    __slots__ = ("script", "_keys", "_args", "_build")

    def __init__(self, script: LuaScript, keys: Sequence | None, args: Sequence | None, build=None):
        self.script, self._keys, self._args, self._build = script, keys, args, build

    def _built(self) -> tuple[Sequence, Sequence]:
        if self._keys is None or self._args is None:
            self._keys, self._args = self._build()
        return self._keys, self._args

    @property
    def keys(self) -> Sequence:
        return self._built()[0]

    @property
    def args(self) -> Sequence:
        return self._built()[1]

    @property
    def command(self) -> tuple:
        keys, args = self._built()
        return ("EVALSHA", self.script.sha, len(keys), *keys, *args)

    def queue(self, pipe) -> None:
        # execute_command: redis-py's cluster pipeline blocks its evalsha() method, though it
        # routes EVALSHA by its keys like any command, which is all a one-slot script needs.
        pipe.execute_command(*self.command)


# Calls per write of a batch (see _send_and_read).
SEND_CHUNK = 8


def _send_and_read(client, calls: Sequence[ScriptCall], then: tuple = (), first: tuple = ()) -> list:
    """One write of all the calls (and the command `then`, if any) and their replies, on this
    thread's connection of the client's pool (eventbus.held), or one from a Sentinel's pool.

    What a redis-py pipeline does for a single server, minus its per-command bookkeeping
    (a third of the publisher's time in the benchmark); EVALSHA replies need no callbacks.
    `first`, a (command, on_reply) pair: the command goes ahead of the calls in the same write,
    and its raw reply (or its error) goes to on_reply as soon as it is read, while Redis runs
    the calls.
    """
    pool = client.connection_pool
    # Sentinel's pool moves its idle connections to a new master; one held would stay behind.
    hold = type(pool) is redis.ConnectionPool
    connection = held.connection_of(pool) if hold else pool.get_connection()
    lead, on_lead = first or ((), None)
    try:
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


# A call a node did not take: its slot lives elsewhere now, or the node is away.
REDIRECTED = (MovedError, AskError, TryAgainError, ClusterDownError)


def _execute(client, calls: Sequence[ScriptCall]) -> list:
    if type(client) is redis.Redis:
        return _send_and_read(client, calls)
    return _execute_on_cluster(client, calls)


def _execute_on_cluster(client, calls: Sequence[ScriptCall]) -> list:
    """Each node gets its calls in one write on one of its connections (_send_and_read), by the
    slot of each call's first key (all of a call's keys share it).

    redis-py's cluster pipeline would ask a node COMMAND GETKEYS for every EVALSHA first, a
    round trip each, all of them to the same node whoever carries the call (bench/cluster.py
    measured it: that node did 0.6-0.7 of the cluster's work). Calls a node redirects (MOVED,
    ASK: a slot that moved; TRYAGAIN, CLUSTERDOWN) or could not take (connection lost) go
    through that pipeline, which follows redirections and refreshes the slot map."""
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
            calls[i].queue(pipe)
        for i, reply in zip(again, pipe.execute(raise_on_error=False)):
            results[i] = reply
    return results


class NotReplicated(redis.TimeoutError):
    """Fewer replicas than asked for acknowledged the writes in time (Redis WAIT). They were
    made on the master, and a failover may lose them: run the calls again (the scripts are
    idempotent), as after any lost connection."""


def run_pipelined(
    client, calls: Sequence[ScriptCall], *, replicas: int = 0, wait_ms: int = 1000, first: tuple = ()
) -> list:
    """Run the calls in one round trip; each result is a value or the exception of its call.

    `replicas` (a single server's client): the round trip ends with WAIT on the same connection,
    and NotReplicated is raised unless that many replicas acknowledged the writes within
    `wait_ms`.

    `first` (a single server's client), a (command, on_reply) pair: the command is sent ahead
    of the calls, and on_reply gets its raw reply (or its error) while Redis runs the calls.
    The router reads its next batch so, and parses it meanwhile."""
    if not calls:
        return []
    wait = ("WAIT", replicas, wait_ms) if replicas else ()
    if (wait or first) and type(client) is not redis.Redis:
        raise TypeError(
            "WAIT and a first command need a single server's client (redis.Redis), not a cluster's"
        )
    results = _attempt(client, calls, wait, first)
    todo = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
    if todo:
        for script in {calls[i].script for i in todo}:
            client.script_load(script.source)
        for i, result in zip(todo, _attempt(client, [calls[i] for i in todo], wait)):
            results[i] = result
    return results


def _attempt(client, calls: Sequence[ScriptCall], wait: tuple, first: tuple = ()) -> list:
    if not wait and not first:
        return [classified(reply) for reply in _execute(client, calls)]
    replies = _send_and_read(client, calls, wait, first)
    if not wait:
        return [classified(reply) for reply in replies]
    acknowledged, replicas, wait_ms = replies.pop(), wait[1], wait[2]
    if isinstance(acknowledged, Exception):
        raise acknowledged
    if acknowledged < replicas:
        raise NotReplicated(
            f"{acknowledged} of {replicas} replica(s) acknowledged the writes within {wait_ms} ms"
        )
    return [classified(reply) for reply in replies]


async def arun_pipelined(client, calls: Sequence[ScriptCall]) -> list:
    """run_pipelined for a redis.asyncio client."""
    if not calls:
        return []
    results: list = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            calls[i].queue(pipe)
        for i, result in zip(todo, await pipe.execute(raise_on_error=False)):
            results[i] = classified(result)
        todo = [i for i in todo if isinstance(results[i], NoScriptError)]
        if not todo or attempt:
            return results
        for script in {calls[i].script for i in todo}:
            await client.script_load(script.source)
    return results


PUBLISH = LuaScript("publish")
ROUTE = LuaScript("route")
DEAD_LETTER = LuaScript("dead_letter")
REDRIVE = LuaScript("redrive")
