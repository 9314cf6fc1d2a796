"""L2 + L3: the router loop. It reads the shard streams of its domains as one consumer of a
group, and settles each entry through route.lua (apply in seq order, state, history, PUBLISH,
ACK) or dead_letter.lua (malformed entries), a pipeline of script calls per batch.

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
from typing import Iterable

from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from . import metrics
from .conf import eventbus_settings
from .redis import get_redis, is_cluster
from .routing import APPLIED, DEFERRED, Delivery, Stream, count_route_results, streams_for
from .scripts import run_pipelined

log = logging.getLogger("eventbus.router")

# While the cluster client polls (it cannot block on streams of several slots), at most this.
CLUSTER_POLL_MS = 100
MAX_BACKOFF = 5.0


def default_consumer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Router:
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
        settings = eventbus_settings
        self.streams = streams_for(domains)
        self.by_key = {stream.key.encode(): stream for stream in self.streams}
        self.group = group or settings.GROUP
        self.consumer = consumer or default_consumer()
        self.count = count or settings.ROUTER_COUNT
        self.block_ms = settings.ROUTER_BLOCK_MS if block_ms is None else block_ms
        self.burst = burst
        self.client = client or get_redis()
        self.cluster = is_cluster(self.client)
        self.deferred: dict[tuple[Stream, str], Delivery] = {}
        self.stop_requested = False
        self._lag_due = self._retry_due = 0.0

    def request_stop(self) -> None:
        self.stop_requested = True

    # The loop ------------------------------------------------------------------------------

    def run(self) -> None:
        log.info("router %s: group %r, streams %s", self.consumer, self.group, [s.key for s in self.streams])
        backoff, recover = 0.1, True
        while not self.stop_requested:
            try:
                if recover:
                    self.ensure_groups()
                    self.recover_pending()
                    recover = False
                busy = self.work_once()
                backoff = 0.1
            except (ConnectionError, TimeoutError) as exc:
                # Redis went away: entries in flight are pending in the group; read them again.
                log.warning("router %s: %s; retrying in %.1fs", self.consumer, exc, backoff)
                self._sleep(backoff)
                backoff, recover = min(backoff * 2, MAX_BACKOFF), True
                continue
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                log.warning("router %s: %s; creating the group again", self.consumer, exc)
                recover = True
                continue
            if self.burst and not busy:
                break
        log.info("router %s: stopped; %d deferred entries left pending", self.consumer, len(self.deferred))

    def work_once(self) -> bool:
        """Read a batch and settle it, then retry the deferred entries; True if anything moved."""
        if self.burst:
            block = None
        elif self.deferred:
            block = min(self.block_ms, eventbus_settings.DEFER_RETRY_MS)
        else:
            block = self.block_ms
        # BLOCK 0 would wait forever: 0 means do not block.
        batch = self.read({stream.key: ">" for stream in self.streams}, block or None)
        progressed = self.settle(batch) if batch else set()
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
        return bool(batch) or bool(progressed)

    # Reading --------------------------------------------------------------------------------

    def ensure_groups(self) -> None:
        for stream in self.streams:
            try:
                # From the start of the stream: events published before the first router ran count.
                self.client.xgroup_create(stream.key, self.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def read(self, ids: dict[str, str], block: int | None) -> list[Delivery]:
        """XREADGROUP from each stream at its id (">" new entries, else our pending after it)."""
        if not self.cluster:
            replies = self.client.xreadgroup(self.group, self.consumer, ids, count=self.count, block=block)
        else:
            pipe = self.client.pipeline(transaction=False)
            for key, last_id in ids.items():
                pipe.xreadgroup(self.group, self.consumer, {key: last_id}, count=self.count)
            replies = [reply for replies in pipe.execute() for reply in replies]
            if block and not any(entries for _, entries in replies):
                self._sleep(min(block, CLUSTER_POLL_MS) / 1000)
        return [
            Delivery.parse(self.by_key[key if isinstance(key, bytes) else key.encode()], stream_id, fields)
            for key, entries in replies
            for stream_id, fields in entries
        ]

    def recover_pending(self) -> None:
        """Settle the entries this consumer read before (a restart with the same name, a lost
        connection) without waiting for the reclaimer."""
        ids = {stream.key: "0" for stream in self.streams}
        while ids and not self.stop_requested:
            batch = self.read(ids, None)
            if not batch:
                return
            ids = {}
            for delivery in batch:
                ids[delivery.stream.key] = delivery.stream_id
            self.settle(batch)

    # Settling -------------------------------------------------------------------------------

    def settle(self, batch: list[Delivery], *, retry: bool = False) -> set[str]:
        """Run each entry's script (only the scripts ACK); returns the jobs that had an entry
        applied, by their applied-seq key."""
        deleted = [d for d in batch if d.deleted]
        if deleted:
            # Gone from the stream (trimmed or XDEL) while pending: nothing left to apply.
            pipe = self.client.pipeline(transaction=False)
            for delivery in deleted:
                pipe.xack(delivery.stream.key, self.group, delivery.stream_id)
            pipe.execute()
            batch = [d for d in batch if not d.deleted]
        results = run_pipelined(self.client, [d.settle_call(self.group) for d in batch])
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
                    applied.add(delivery.event.keys.applied)
        for (labels, result), n in counts.items():
            count_route_results(labels, result, n, retry=retry)
        return applied

    def retry_deferred(self, jobs: set[str] | None = None) -> set[str]:
        """Try the deferred entries again (of these jobs, default all), in seq order, and again
        for the jobs that moved; returns the jobs that had an entry applied."""
        self._forget_old_deferred()
        progressed: set[str] = set()
        while True:
            candidates = [d for d in self.deferred.values() if jobs is None or d.event.keys.applied in jobs]
            if not candidates:
                return progressed
            jobs = self.settle(sorted(candidates, key=lambda d: d.event.seq), retry=True)
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

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop_requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
