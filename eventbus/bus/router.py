"""L2 + L3: the router loop. It reads the shard streams of its domains as one consumer of a
group, and settles its entries through route.lua (apply in seq order, state, history, PUBLISH,
ACK; a call per run of entries of one stream) or dead_letter.lua (malformed entries), a pipeline
of script calls per batch.

An entry whose predecessor is not applied yet (it went to another router of the group, or is
still pending somewhere) is deferred: kept here, unacked, never published early, and tried
again as soon as this router applies an entry of its job, and every DEFER_RETRY_MS (another
router may have). Entries left pending (a crash, a forced stop, a predecessor that never
comes) are the reclaimer's: it re-delivers them or moves them to the dead letters.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Iterable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from eventbus import metrics
from eventbus.bus.delivery import (
    APPLIED,
    DEFERRED,
    Delivery,
    Settlement,
    Stream,
    count_route_results,
    streams_for,
)
from eventbus.bus.loop import LoopWorker
from eventbus.bus.scripts import run_pipelined
from eventbus.conf import eventbus_settings
from eventbus.redis.clients import by_node, get_redis, is_cluster

log = logging.getLogger("eventbus.bus.router")

# While the cluster client polls (it cannot block on streams of several slots): from this...
CLUSTER_POLL_MIN_MS = 2
# ...doubling while nothing comes, up to this.
CLUSTER_POLL_MS = 100
# How long a stream whose key holds another type is set aside before it is tried again.
SET_ASIDE_SECONDS = 5.0


def default_consumer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Router(LoopWorker):
    name = "run_router"

    def __init__(
        self,
        *,
        domains: Iterable[str] | None = None,
        group: str | None = None,
        consumer: str | None = None,
        count: int | None = None,
        block_ms: int | None = None,
        burst: bool = False,
        client=None,
    ):
        super().__init__(burst=burst)
        settings = eventbus_settings
        self.streams = streams_for(domains)
        self.by_key = {stream.key.encode(): stream for stream in self.streams}
        self.group = group or settings.GROUP
        self.consumer = consumer or default_consumer()
        self.count = count or settings.ROUTER_COUNT
        self.block_ms = settings.ROUTER_BLOCK_MS if block_ms is None else block_ms
        self.client = client or get_redis()
        self.cluster = is_cluster(self.client)
        self.deferred: dict[tuple[Stream, str], Delivery] = {}
        # Streams whose key cannot be read (it holds another type): set aside until the given
        # time, so that the other streams' events keep flowing.
        self.set_aside: dict[Stream, float] = {}
        self._lag_due = self._retry_due = 0.0
        self._poll_ms = CLUSTER_POLL_MIN_MS
        # The next batch, read while Redis ran the scripts of the last one (see settle).
        self._ahead: list[Delivery] | None = None
        self._ahead_error: Exception | None = None

    # The loop (eventbus.bus.loop) ---------------------------------------------------------------

    def run(self) -> int:
        log.info("router %s: group %r, streams %s", self.consumer, self.group, [s.key for s in self.streams])
        try:
            return super().run()
        finally:
            log.info(
                "router %s: stopped; %d deferred entries left pending", self.consumer, len(self.deferred)
            )

    def setup(self) -> None:
        # After a failure too: Redis may have lost the groups, and entries in flight are
        # pending in the group (a batch read ahead too); read them again. A read ahead's error
        # left by a unit that failed before it raised it is that failure's, not the next unit's.
        self._ahead, self._ahead_error = None, None
        self.ensure_groups()
        self.recover_pending()

    @property
    def active(self) -> list[Stream]:
        now = time.monotonic()
        for stream, until in list(self.set_aside.items()):
            if until <= now and self._create_group(stream):
                del self.set_aside[stream]
                log.info("router %s: stream %s is readable again", self.consumer, stream.key)
        return [stream for stream in self.streams if stream not in self.set_aside]

    def work_once(self) -> int:
        """Read a batch and settle it, then retry the deferred entries; 1 if anything moved."""
        if self.burst:
            block = None
        elif self.deferred:
            block = min(self.block_ms, eventbus_settings.DEFER_RETRY_MS)
        else:
            block = self.block_ms
        # BLOCK 0 would wait forever: 0 means do not block.
        active = self.active
        if not active:
            self.wait(SET_ASIDE_SECONDS)
            return 0
        ids = {stream.key: ">" for stream in active}
        if self._ahead:
            batch, self._ahead = self._ahead, None
        else:
            batch = self.read(ids, block or None)
        progressed = self.settle(batch, read_ahead=ids) if batch else set()
        # A deferred entry can move only after its job's previous event was applied: by us just
        # now (retry that job's), or by another router, which we cannot see (retry them all,
        # every DEFER_RETRY_MS).
        now = time.monotonic()
        if self.deferred and now >= self._retry_due:
            self._retry_due = now + eventbus_settings.DEFER_RETRY_MS / 1000
            progressed |= self.retry_deferred()
        elif self.deferred and progressed:
            progressed |= self.retry_deferred(progressed)
        self._update_lag()
        return int(bool(batch) or bool(progressed))

    def teardown(self) -> None:
        # Stopped with a batch read ahead: it is the batch in hand, settled before the exit.
        batch, self._ahead = self._ahead, None
        if batch:
            try:
                self.settle(batch)
            except Exception as exc:  # left pending: recover_pending or the reclaimer settle it
                log.warning("router %s: the batch read ahead stays pending: %s", self.consumer, exc)

    # Reading --------------------------------------------------------------------------------

    def ensure_groups(self) -> None:
        for stream in self.streams:
            if stream not in self.set_aside and not self._create_group(stream):
                self.set_aside[stream] = time.monotonic() + SET_ASIDE_SECONDS

    def _create_group(self, stream: Stream) -> bool:
        """The group on the stream (from its start: events published before the first router
        ran count); False when the stream's key holds another type and is set aside."""
        try:
            self.client.xgroup_create(stream.key, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" in str(exc):
                return True
            if "WRONGTYPE" in str(exc):
                log.error(
                    "router %s: the key %s holds a %s, not a stream: set aside, tried again every "
                    "%ss (the other streams are served)",
                    self.consumer,
                    stream.key,
                    self._type_of(stream.key),
                    SET_ASIDE_SECONDS,
                )
                return False
            raise
        return True

    def _type_of(self, key: str) -> str:
        try:
            kind = self.client.type(key)
        except ResponseError:
            return "value of another type"
        return kind.decode() if isinstance(kind, bytes) else str(kind)

    def read(self, ids: dict[str, str], block: int | None) -> list[Delivery]:
        """XREADGROUP from each stream at its id (">" new entries, else our pending after it)."""
        if not self.cluster or len(ids) == 1:
            # One server, or one stream (a router per shard): one read that blocks.
            replies = self.client.xreadgroup(self.group, self.consumer, ids, count=self.count, block=block)
        else:
            replies = self._read_cluster(ids)
            if not any(entries for _, entries in replies):
                if block:
                    # Nothing: poll again soon, then less often while nothing comes.
                    self.wait(min(block, self._poll_ms) / 1000)
                    self._poll_ms = min(self._poll_ms * 2, CLUSTER_POLL_MS)
            else:
                self._poll_ms = CLUSTER_POLL_MIN_MS
        return self._deliveries(replies)

    def _deliveries(self, replies) -> list[Delivery]:
        return [
            Delivery.parse(self.by_key[key if isinstance(key, bytes) else key.encode()], stream_id, fields)
            for key, entries in replies
            for stream_id, fields in entries
        ]

    def _read_ahead_command(self, ids: dict[str, str]) -> tuple:
        """The XREADGROUP of the next batch, sent ahead of this batch's scripts: never BLOCK,
        which would hold the scripts behind it."""
        return (
            "XREADGROUP",
            "GROUP",
            self.group,
            self.consumer,
            "COUNT",
            self.count,
            "STREAMS",
            *ids,
            *ids.values(),
        )

    def _take_ahead(self, reply) -> None:
        """The raw reply of the read ahead, parsed while Redis runs the scripts."""
        if isinstance(reply, Exception):
            self._ahead_error = reply  # raised once the batch in hand is settled
            return
        # RESP2: [[key, [[id, [field, value, ...]], ...]], ...]; RESP3 a map of key to entries.
        streams = reply.items() if isinstance(reply, dict) else reply or ()
        self._ahead = (
            self._deliveries(
                (
                    key,
                    [
                        (stream_id, dict(zip(fields[::2], fields[1::2])) if fields else None)
                        for stream_id, fields in entries
                    ],
                )
                for key, entries in streams
            )
            or None
        )

    def _read_cluster(self, ids: dict[str, str]) -> list:
        """A cluster cannot block on streams of several slots: each master is asked for its
        streams in one pipeline of its own (redis-py's cluster pipeline would first ask one
        node COMMAND GETKEYS for every XREADGROUP); a stream whose slot moved is read through
        the cluster client, which follows it."""
        reads = list(ids.items())
        replies: list = []
        for node, indexes in by_node(self.client, ids):
            streams = [reads[i] for i in indexes]
            pipe = node.redis_connection.pipeline(transaction=False)
            for key, last_id in streams:
                pipe.xreadgroup(self.group, self.consumer, {key: last_id}, count=self.count)
            try:
                answers = pipe.execute(raise_on_error=False)
            except (RedisConnectionError, RedisTimeoutError):
                answers = [None] * len(streams)
            for (key, last_id), answer in zip(streams, answers):
                if isinstance(answer, (Exception, type(None))):
                    # Moved, or the node is away: the cluster client follows (or raises).
                    answer = self.client.xreadgroup(
                        self.group, self.consumer, {key: last_id}, count=self.count
                    )
                replies.extend(answer or ())
        return replies

    def recover_pending(self) -> None:
        """Settle the entries this consumer read before (a restart with the same name, a lost
        connection) without waiting for the reclaimer."""
        ids = {stream.key: "0" for stream in self.active}
        while ids and not self.stop_requested:
            batch = self.read(ids, None)
            if not batch:
                return
            ids = {}
            for delivery in batch:
                ids[delivery.stream.key] = delivery.stream_id
            self.settle(batch)

    # Settling -------------------------------------------------------------------------------

    def settle(
        self, batch: list[Delivery], *, retry: bool = False, read_ahead: dict[str, str] | None = None
    ) -> set[str]:
        """Run each entry's script (only the scripts ACK); returns the jobs that had an entry
        applied, by their applied-seq key.

        `read_ahead` (stream key -> id): the next batch is read in the same round trip, ahead
        of the scripts, and parsed while Redis runs them (the router's Python and Redis work
        at once); the next work_once settles it. On one server only (a cluster reads per
        master), and not once a stop was asked for."""
        deleted = [d for d in batch if d.deleted]
        if deleted:
            # Gone from the stream (trimmed or XDEL) while pending: nothing left to apply.
            pipe = self.client.pipeline(transaction=False)
            for delivery in deleted:
                pipe.xack(delivery.stream.key, self.group, delivery.stream_id)
            pipe.execute()
            batch = [d for d in batch if not d.deleted]
        settlement = Settlement(batch, self.group)
        first: tuple = ()
        if read_ahead and not self.cluster and not self.stop_requested:
            first = (self._read_ahead_command(read_ahead), self._take_ahead)
        try:
            replies = run_pipelined(self.client, settlement.calls, first=first)
        except Exception as exc:
            settlement.failed(exc)  # its route spans (tracing) end failed
            raise
        results = settlement.results(replies)
        applied = set()
        counts: Counter = Counter()
        for delivery, result in zip(batch, results):
            key = (delivery.stream, delivery.stream_id)
            if isinstance(result, Exception):
                # Left pending (the script wrote nothing): the reclaimer retries it, and
                # dead-letters it past MAX_DELIVERIES with this error as the reason.
                log.error(
                    "router %s: entry %s of %s failed, left pending: %s",
                    self.consumer,
                    delivery.stream_id,
                    delivery.stream.key,
                    result,
                )
                self.deferred.pop(key, None)
                continue
            if delivery.malformed:
                if result:
                    metrics.DEAD_LETTERS.labels(*delivery.stream.labels).inc()
                    log.warning(
                        "router %s: dead letter %s of %s: %s",
                        self.consumer,
                        delivery.stream_id,
                        delivery.stream.key,
                        delivery.malformed,
                    )
                continue
            counts[delivery.stream.labels, result] += 1
            if result == DEFERRED:
                self.deferred.setdefault(key, delivery)
            else:
                self.deferred.pop(key, None)
                if result == APPLIED:
                    applied.add(delivery.routed.keys.applied)
        for (labels, result), n in counts.items():
            count_route_results(labels, result, n, retry=retry)
        error, self._ahead_error = self._ahead_error, None
        if error is not None:
            raise error  # the read ahead failed (its group gone?): setup() runs again
        return applied

    def retry_deferred(self, jobs: set[str] | None = None) -> set[str]:
        """Try the deferred entries again (of these jobs, default all), in seq order, and again
        for the jobs that moved; returns the jobs that had an entry applied."""
        self._forget_old_deferred()
        progressed: set[str] = set()
        while True:
            candidates = [d for d in self.deferred.values() if jobs is None or d.routed.keys.applied in jobs]
            if not candidates:
                return progressed
            jobs = self.settle(sorted(candidates, key=lambda d: d.routed.seq), retry=True)
            if not jobs:
                return progressed
            progressed |= jobs

    def _forget_old_deferred(self) -> None:
        # Past the reclaim horizon the reclaimer owns the entry; bounded memory either way.
        horizon = time.monotonic() - eventbus_settings.RECLAIM_MIN_IDLE_MS / 1000
        limit = eventbus_settings.DEFER_MAX
        while self.deferred:
            key, oldest = next(iter(self.deferred.items()))  # insertion order: oldest first
            if oldest.since >= horizon and len(self.deferred) <= limit:
                return
            del self.deferred[key]

    # Housekeeping ---------------------------------------------------------------------------

    def _update_lag(self) -> None:
        now = time.monotonic()
        if now < self._lag_due:
            return
        self._lag_due = now + eventbus_settings.LAG_INTERVAL
        pipe = self.client.pipeline(transaction=False)
        for stream in self.streams:
            pipe.xinfo_groups(stream.key)
        names = (self.group, self.group.encode())
        for stream, groups in zip(self.streams, pipe.execute(raise_on_error=False)):
            for group in () if isinstance(groups, Exception) else groups:
                # "lag" is Redis >= 7.0 (and None when Redis cannot tell); 6.2 has none.
                if group["name"] in names and group.get("lag") is not None:
                    metrics.CONSUMER_LAG.labels(*stream.labels).set(group["lag"])
