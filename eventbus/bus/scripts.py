"""The Lua scripts of the bus, read once from eventbus/bus/lua/ and run by SHA (EVALSHA).

A server that does not know a script (restart, failover, SCRIPT FLUSH) answers NOSCRIPT: the
script is loaded then and the refused calls run again, in their order (eventbus.redis.internals
runs the calls: on a raw connection, or through redis-py's public pipeline and Script objects).

A script that finds one of its keys holding the wrong type (or a seq key holding no seq) writes
nothing and answers "CORRUPT <key> ...": that reply comes back as CorruptKey, naming the key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from importlib import resources

import redis
from redis.exceptions import ResponseError

from eventbus.redis.internals import arun_scripts, run_scripts


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
        folder = resources.files("eventbus.bus") / "lua"
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
    is sent: a batch goes out in chunks (eventbus.redis.internals), and building the next chunk
    overlaps Redis running the last."""

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

    `first` (a single server's client), a (command, on_reply) pair: the command may be sent
    ahead of the calls, and on_reply then gets its raw reply (or its error) while Redis runs the
    calls. The router reads its next batch so, and parses it meanwhile; when on_reply is not
    called (redis-py's public API: eventbus.redis.internals), it reads the batch on its own."""
    if not calls:
        return []
    wait = ("WAIT", replicas, wait_ms) if replicas else ()
    if (wait or first) and type(client) is not redis.Redis:
        raise TypeError(
            "WAIT and a first command need a single server's client (redis.Redis), not a cluster's"
        )
    replies = run_scripts(client, calls, wait, first)
    if wait:
        acknowledged = replies.pop()
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
    return [classified(reply) for reply in await arun_scripts(client, calls)]


PUBLISH = LuaScript("publish")
ROUTE = LuaScript("route")
DEAD_LETTER = LuaScript("dead_letter")
REDRIVE = LuaScript("redrive")
