"""The Lua scripts of the bus, read once from eventbus/lua/ and run by SHA (EVALSHA).

A server that does not know a script (restart, failover, SCRIPT FLUSH) answers NOSCRIPT: the
script is loaded then and the refused calls run again, in their order. Loading through the
client also reaches every primary of a cluster.

A script that finds one of its keys holding the wrong type (or a seq key holding no seq) writes
nothing and answers "CORRUPT <key> ...": that reply comes back as CorruptKey, naming the key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources

import redis
from redis.exceptions import NoScriptError, ResponseError

try:
    from hiredis import pack_command
except ImportError:  # pragma: no cover - redis[hiredis] is a requirement
    pack_command = None  # type: ignore[assignment]  # redis-py packs the commands itself


class CorruptKey(ResponseError):
    """A script found one of its keys holding the wrong type, or a seq key holding no seq, and
    wrote nothing. The message names the key; the call succeeds once the key is repaired."""


def _classified(result):
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


class ScriptCall:
    __slots__ = ("script", "keys", "args")

    def __init__(self, script: LuaScript, keys: Sequence, args: Sequence):
        self.script, self.keys, self.args = script, keys, args

    @property
    def command(self) -> tuple:
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)

    def queue(self, pipe) -> None:
        # execute_command: redis-py's cluster pipeline blocks its evalsha() method, though it
        # routes EVALSHA by its keys like any command, which is all a one-slot script needs.
        pipe.execute_command(*self.command)


def _send_and_read(client, calls: Sequence[ScriptCall], then: tuple = ()) -> list:
    """One write of all the calls (and the command `then`, if any) and their replies, on one
    pooled connection.

    What a redis-py pipeline does for a single server, minus its per-command bookkeeping
    (a third of the publisher's time in the benchmark); EVALSHA replies need no callbacks.
    """
    pool = client.connection_pool
    connection = pool.get_connection()
    commands = [call.command for call in calls] + ([then] if then else [])
    try:
        if pack_command is not None:
            connection.send_packed_command([b"".join([pack_command(command) for command in commands])])
        else:
            connection.send_packed_command(connection.pack_commands(commands))
        results = []
        for _ in commands:
            try:
                results.append(connection.read_response())
            except ResponseError as exc:
                results.append(exc)
        return results
    except BaseException:
        connection.disconnect()  # replies may be left unread: never reuse it
        raise
    finally:
        pool.release(connection)


def _execute(client, calls: Sequence[ScriptCall]) -> list:
    if type(client) is redis.Redis:
        return _send_and_read(client, calls)
    pipe = client.pipeline(transaction=False)  # a cluster routes each call to its slot's node
    for call in calls:
        call.queue(pipe)
    return pipe.execute(raise_on_error=False)


class NotReplicated(redis.TimeoutError):
    """Fewer replicas than asked for acknowledged the writes in time (Redis WAIT). They were
    made on the master, and a failover may lose them: run the calls again (the scripts are
    idempotent), as after any lost connection."""


def run_pipelined(client, calls: Sequence[ScriptCall], *, replicas: int = 0, wait_ms: int = 1000) -> list:
    """Run the calls in one round trip; each result is a value or the exception of its call.

    `replicas` (a single server's client): the round trip ends with WAIT on the same connection,
    and NotReplicated is raised unless that many replicas acknowledged the writes within
    `wait_ms`."""
    if not calls:
        return []
    results: list = [None] * len(calls)
    todo = list(range(len(calls)))
    wait = ("WAIT", replicas, wait_ms) if replicas else ()
    if wait and type(client) is not redis.Redis:
        raise TypeError("WAIT for replicas needs a single server's client (redis.Redis), not a cluster's")
    for attempt in range(2):
        replies = (
            _send_and_read(client, [calls[i] for i in todo], wait)
            if wait
            else _execute(client, [calls[i] for i in todo])
        )
        if wait:
            acknowledged = replies.pop()
            if isinstance(acknowledged, Exception):
                raise acknowledged
            if acknowledged < replicas:
                raise NotReplicated(
                    f"{acknowledged} of {replicas} replica(s) acknowledged the writes within {wait_ms} ms"
                )
        for i, result in zip(todo, replies):
            results[i] = _classified(result)
        todo = [i for i in todo if isinstance(results[i], NoScriptError)]
        if not todo or attempt:
            return results
        for script in {calls[i].script for i in todo}:
            client.script_load(script.source)
    return results


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
            results[i] = _classified(result)
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
