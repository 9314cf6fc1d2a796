"""The reclaimer: entries left pending by a router (crash, forced stop, a predecessor that did
not come) are claimed with XAUTOCLAIM once idle for min_idle_ms and settled through the same
scripts as the router's. An entry delivered more than max_deliveries times without being
applied, or malformed, goes to its shard's dead-letter stream with the reason.

Domains are reclaimed in parallel (asyncio.gather), the shards of a domain in turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from redis.exceptions import ConnectionError, RedisError, ResponseError, TimeoutError

from eventbus import metrics
from eventbus.bus.delivery import DEFERRED, Delivery, Settlement, Stream, count_route_results
from eventbus.bus.keys import stream_key
from eventbus.bus.loop import LoopWorker
from eventbus.bus.scripts import arun_pipelined
from eventbus.conf import eventbus_settings
from eventbus.jobtypes import domains as all_domains
from eventbus.jobtypes import shard_count
from eventbus.redis.clients import make_async_redis

log = logging.getLogger("eventbus.bus.reclaimer")


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_xautoclaim(reply) -> tuple[str, list[tuple[str, dict]], list[str], int]:
    """A raw XAUTOCLAIM reply as (next cursor, [(id, fields)], deleted ids, nil entries).

    Redis 7:   [cursor, entries, deleted ids]; the server already dropped the deleted ids
               from the PEL and left them out of the entries.
    Redis 6.2: [cursor, entries]; an entry deleted from the stream is claimed anyway and
               comes back as nil, without its id (counted here, cleaned up by the caller).
    """
    cursor, raw_entries = _str(reply[0]), reply[1] or []
    deleted = [_str(entry_id) for entry_id in reply[2]] if len(reply) > 2 and reply[2] else []
    entries, nils = [], 0
    for item in raw_entries:
        if item is None or item[1] is None:
            nils += 1
            continue
        entry_id, fields = item[0], item[1]
        if not isinstance(fields, dict):
            fields = dict(zip(fields[::2], fields[1::2]))
        entries.append((_str(entry_id), fields))
    return cursor, entries, deleted, nils


def stream_configs(domains: Iterable[str] | None = None) -> list[tuple[str, int]]:
    """[(domain, shard_count), ...] of these domains (default: every domain, jobtypes.domains())."""
    return [(domain, shard_count(domain)) for domain in (domains or all_domains())]


class Reclaimer(LoopWorker):
    name = "run_reclaimer"
    one_pass_burst = True  # --burst: one pass, then exit

    def __init__(
        self,
        *,
        streams: list[tuple[str, int]] | None = None,
        group: str | None = None,
        consumer: str | None = None,
        min_idle_ms: int | None = None,
        count: int | None = None,
        max_deliveries: int | None = None,
        interval: float | None = None,
        burst: bool = False,
        client_factory=make_async_redis,
    ):
        super().__init__(burst=burst)
        settings = eventbus_settings
        self.streams = streams or stream_configs()
        for domain, _ in self.streams:
            shard_count(domain)  # refuses unknown domains now, not in the loop
        self.group = group or settings.GROUP
        self.consumer = consumer or settings.RECLAIM_CONSUMER
        self.min_idle_ms = settings.RECLAIM_MIN_IDLE_MS if min_idle_ms is None else min_idle_ms
        self.count = count or settings.RECLAIM_COUNT
        self.max_deliveries = max_deliveries or settings.MAX_DELIVERIES
        self.interval = settings.RECLAIM_INTERVAL if interval is None else interval
        self.pause = self.interval
        self.client_factory = client_factory
        self.client: Any = None  # the pass's redis.asyncio client

    # The loop (eventbus.bus.loop): one unit is a pass over every stream --------------------------

    def work_once(self) -> int:
        claimed = asyncio.run(self.reclaim_pass())
        log.info("reclaimer: %d entries claimed", claimed)
        return claimed

    async def reclaim_pass(self) -> int:
        # A client per pass: it belongs to the pass's event loop.
        self.client = self.client_factory()
        # The raw reply, so that one parser handles the 6.2 and 7 shapes (and nil entries).
        self.client.set_response_callback("XAUTOCLAIM", lambda response, **options: response)
        try:
            # Set up before the domains' passes run at once: a cluster client's first commands
            # all set it up otherwise, each resetting the connections the others are using.
            await self.client.initialize()
            return await self.reclaim_all()
        finally:
            await self.client.aclose()
            self.client = None

    async def reclaim_all(self) -> int:
        # Every domain's pass ends before the pass's client closes (reclaim_pass): a failure of
        # one is raised once the others are done, never into them through a closed client.
        counts = await asyncio.gather(
            *(self.reclaim_domain(domain, shards) for domain, shards in self.streams), return_exceptions=True
        )
        for count in counts:
            if isinstance(count, BaseException):
                raise count
        return sum(counts)  # type: ignore[arg-type]

    async def reclaim_domain(self, domain: str, shards: int) -> int:
        total = 0
        for shard in range(shards):
            if self.stop_requested:
                break
            try:
                total += await self.reclaim_shard(Stream(domain, shard))
            except (ConnectionError, TimeoutError):
                raise
            except RedisError:
                # One shard's trouble (a key of the wrong type...) must not stop the others.
                log.exception("reclaimer: %s failed; next pass tries again", stream_key(domain, shard))
        return total

    async def reclaim_shard(self, stream: Stream) -> int:
        started, claimed, cursor = time.perf_counter(), 0, "0-0"
        while True:
            try:
                reply = await self.client.execute_command(
                    "XAUTOCLAIM",
                    stream.key,
                    self.group,
                    self.consumer,
                    self.min_idle_ms,
                    cursor,
                    "COUNT",
                    self.count,
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                # No stream or no group yet: no router ever ran on it, so nothing is pending.
                log.debug("reclaimer: %s: %s", stream.key, exc)
                return claimed
            next_cursor, entries, deleted, nils = parse_xautoclaim(reply)
            claimed += len(entries)
            if deleted:
                await self.client.xack(stream.key, self.group, *deleted)
            if nils:
                await self._ack_vanished(stream, cursor, next_cursor, {entry_id for entry_id, _ in entries})
            if entries:
                await self.settle(stream, [Delivery.parse(stream, i, f) for i, f in entries])
            if next_cursor == "0-0" or self.stop_requested:
                break
            cursor = next_cursor
        metrics.RECLAIM_MESSAGES.labels(*stream.labels).inc(claimed)
        metrics.RECLAIM_LATENCY.labels(*stream.labels).observe(time.perf_counter() - started)
        return claimed

    # Settling -------------------------------------------------------------------------------

    async def settle(self, stream: Stream, batch: list[Delivery]) -> None:
        settlement = Settlement(batch, self.group)
        try:
            replies = await arun_pipelined(self.client, settlement.calls)
        except Exception as exc:
            settlement.failed(exc)  # its route spans (tracing) end failed
            raise
        results = settlement.results(replies)
        stuck = []  # well-formed, not applied: deferred, or its script failed
        for delivery, result in zip(batch, results):
            if delivery.malformed:
                self._count_dead(delivery, result, delivery.malformed)
            elif isinstance(result, Exception) or result == DEFERRED:
                stuck.append((delivery, result))
            else:
                count_route_results(delivery.stream.labels, result)
        if not stuck:
            return
        deliveries = await self._deliveries(stream, [d.stream_id for d, _ in stuck])
        doomed = []
        for delivery, result in stuck:
            times = deliveries.get(delivery.stream_id, 0)
            if times <= self.max_deliveries:
                if isinstance(result, Exception):
                    # Left pending: the next pass claims it again, until max_deliveries.
                    log.warning(
                        "reclaimer: route script failed for %s of %s (delivery %d), left pending: %s: %s",
                        delivery.stream_id,
                        delivery.stream.key,
                        times,
                        type(result).__name__,
                        result,
                    )
                else:
                    count_route_results(delivery.stream.labels, result)
                continue
            reason = (
                f"route script failed: {result}"
                if isinstance(result, Exception)
                else delivery.never_applied_reason()
            )
            doomed.append((delivery, reason, times))
        if doomed:
            calls = [d.dead_letter_call(self.group, reason, times) for d, reason, times in doomed]
            for (delivery, reason, _), result in zip(doomed, await arun_pipelined(self.client, calls)):
                self._count_dead(delivery, result, reason)

    async def _deliveries(self, stream: Stream, ids: list[str]) -> dict[str, int]:
        """How often each entry was delivered (XAUTOCLAIM does not say): XPENDING per entry."""
        pipe = self.client.pipeline(transaction=False)
        for entry_id in ids:
            pipe.xpending_range(stream.key, self.group, min=entry_id, max=entry_id, count=1)
        return {
            _str(row["message_id"]): row["times_delivered"] for rows in await pipe.execute() for row in rows
        }

    async def _ack_vanished(self, stream: Stream, start: str, end: str, seen: set[str]) -> None:
        # Redis 6.2 claimed entries deleted from the stream into our PEL, and named them nil:
        # find them among ours in the page's id range and ACK them, or they would come back.
        rows = await self.client.xpending_range(
            stream.key,
            self.group,
            min=start,
            max="+" if end == "0-0" else end,
            count=self.count * 2,
            consumername=self.consumer,
        )
        candidates = [_str(row["message_id"]) for row in rows if _str(row["message_id"]) not in seen]
        pipe = self.client.pipeline(transaction=False)
        for entry_id in candidates:
            pipe.xrange(stream.key, entry_id, entry_id)
        vanished = [i for i, found in zip(candidates, await pipe.execute()) if not found]
        if vanished:
            await self.client.xack(stream.key, self.group, *vanished)

    def _count_dead(self, delivery: Delivery, result, reason: str) -> None:
        if isinstance(result, Exception):
            # dead_letter.lua wrote nothing, the ACK included: the next pass tries again.
            log.error(
                "reclaimer: dead-lettering %s of %s (%s) failed, left pending: %s",
                delivery.stream_id,
                delivery.stream.key,
                reason,
                result,
            )
        elif result:
            metrics.DEAD_LETTERS.labels(*delivery.stream.labels).inc()
            log.warning(
                "reclaimer: dead letter %s of %s: %s", delivery.stream_id, delivery.stream.key, reason
            )
