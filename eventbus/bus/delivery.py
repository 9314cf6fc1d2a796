"""The delivery of stream entries, what the router and the reclaimer share: the shard streams,
a delivered entry, and the script calls that settle a batch of them (route.lua applies and acks
them, dead_letter.lua moves and acks one). (gateway/routing.py is Channels' URL routing.)"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from eventbus import metrics
from eventbus.bus.events import MalformedEntry, RoutedEvent, parse_entry
from eventbus.bus.keys import dead_letter_key, stream_key
from eventbus.bus.scripts import DEAD_LETTER, ROUTE, ScriptCall, classified
from eventbus.conf import eventbus_settings
from eventbus.jobtypes import UnknownJobType, shard_count
from eventbus.jobtypes import domains as all_domains
from eventbus.redis.clients import publish_command
from exactly_once import tracing
from exactly_once.tracing import TRACING

# route.lua's replies.
DUPLICATE, APPLIED, DEFERRED = 0, 1, 2
ROUTE_OUTCOMES = {DUPLICATE: "duplicate", APPLIED: "applied", DEFERRED: "deferred"}


class Stream:
    """One shard stream of a domain; its keys and labels computed once (they are hot)."""

    __slots__ = ("domain", "shard", "key", "dead_letters", "labels")

    def __init__(self, domain: str, shard: int):
        self.domain, self.shard = domain, shard
        self.key = stream_key(domain, shard)
        self.dead_letters = dead_letter_key(domain, shard)
        self.labels = (domain, str(shard))

    def __eq__(self, other):
        return isinstance(other, Stream) and (self.domain, self.shard) == (other.domain, other.shard)

    def __hash__(self):
        return hash((self.domain, self.shard))

    def __repr__(self):
        return f"<Stream {self.key}>"


def streams_for(domains: Iterable[str] | None = None) -> list[Stream]:
    """Every shard stream of these domains (default: every domain, jobtypes.domains()); an entry
    `domain:shard` names one shard (routers per shard on a Redis Cluster)."""
    streams: list[Stream] = []
    for name in list(domains) if domains else all_domains():
        domain, colon, shard = str(name).partition(":")
        count = shard_count(domain)  # UnknownJobType
        if not colon:
            streams.extend(Stream(domain, n) for n in range(count))
        elif shard.isdigit() and int(shard) < count:
            streams.append(Stream(domain, int(shard)))
        else:
            raise UnknownJobType(f"No shard {name!r}: domain {domain!r} has shards 0-{count - 1}")
    return list(dict.fromkeys(streams))


@dataclass(slots=True)
class Delivery:
    """One entry read from a shard stream by a consumer of the group, until it is settled."""

    stream: Stream
    stream_id: str
    fields: dict  # bytes -> bytes; empty when the entry was deleted from the stream
    event: RoutedEvent | None = None
    malformed: str | None = None  # why the entry can never be applied
    since: float = field(default_factory=time.monotonic)

    @classmethod
    def parse(cls, stream: Stream, stream_id, fields: dict | None) -> Delivery:
        stream_id = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
        delivery = cls(stream, stream_id, fields or {})
        if delivery.fields:
            try:
                delivery.event = parse_entry(stream.domain, stream.shard, stream_id, delivery.fields)
            except MalformedEntry as exc:
                delivery.malformed = str(exc)
        return delivery

    @property
    def deleted(self) -> bool:
        return not self.fields

    @property
    def routed(self) -> RoutedEvent:
        """The parsed event of an entry that is neither malformed nor deleted."""
        assert self.event is not None, "a malformed or deleted entry has no event"
        return self.event

    def dead_letter_call(self, group: str, reason: str, deliveries: int | None = None) -> ScriptCall:
        pairs = [item for pair in self.fields.items() for item in pair]
        return DEAD_LETTER.call(
            (self.stream.key, self.stream.dead_letters),
            (group, self.stream_id, reason, "" if deliveries is None else deliveries, *pairs),
        )

    def never_applied_reason(self) -> str:
        return f"predecessor seq {self.routed.prev_seq} never applied"


# Entries per route.lua call: one call spares Redis a script call and an XACK per entry, and a
# call of 50 runs well under a millisecond, so the publishers and readers it holds up wait little.
ROUTE_CALL_SIZE = 50


class Settlement:
    """The script calls that settle a batch of deliveries on first sight, and each delivery's
    result once they ran: dead_letter.lua for each malformed entry, route.lua for the
    well-formed ones, a call per run of up to ROUTE_CALL_SIZE entries of one stream, in the
    batch's order (a job's entries are all in its shard's stream: its seq order is kept).

    With tracing on, an entry that carries its publish's trace context (`tp`) is routed in an
    "eventbus.route" span, the publish span's child, ended once its result is known; the
    channel's copy of the event carries the route span's context on to the gateway (route.lua)."""

    __slots__ = ("calls", "_settles", "_spans")

    def __init__(self, batch: Sequence[Delivery], group: str):
        self.calls: list[ScriptCall] = []
        self._settles: list[list[int]] = []  # per call, the indexes in the batch it settles
        self._spans: dict = {}  # index in the batch -> its route span (tracing on)
        runs: dict[Stream, list[int]] = {}
        for i, delivery in enumerate(batch):
            if delivery.malformed:
                self._add(delivery.dead_letter_call(group, delivery.malformed), [i])
            else:
                runs.setdefault(delivery.stream, []).append(i)
        settings = eventbus_settings
        common = (
            publish_command(),
            group,
            settings.ROUTER_DEDUP_TTL,
            settings.STATE_TTL,
            settings.HISTORY_TTL,
            settings.HISTORY_MAXLEN,
        )
        for stream, indexes in runs.items():
            for start in range(0, len(indexes), ROUTE_CALL_SIZE):
                run = indexes[start : start + ROUTE_CALL_SIZE]
                keys, args = [stream.key], list(common)
                for i in run:
                    event = batch[i].routed
                    job = event.keys
                    keys += (
                        job.applied,
                        job.router_published(event.seq),
                        job.state,
                        job.history,
                        job.channel,
                    )
                    args += (event.seq, event.prev_seq, event.event, event.stream_id)
                if TRACING:
                    args = self._traced(batch, run, args, len(common))
                self._add(ROUTE.call(keys, args), run)

    def _add(self, call: ScriptCall, indexes: list[int]) -> None:
        self.calls.append(call)
        self._settles.append(indexes)

    def _traced(self, batch: Sequence[Delivery], run: list[int], args: list, common_args: int) -> list:
        """The route call's arguments (`common_args` of them before the entries') with a
        traceparent for each entry (route.lua: a fifth per entry) when one of them carries its
        publish's; a route span started for each that does."""
        spans = {}
        for i in run:
            event = batch[i].routed
            if event.tp:
                spans[i] = tracing.start(
                    "eventbus.route",
                    tracing.extract(event.tp),
                    job_id=event.job_id,
                    domain=event.keys.domain,
                    seq=event.seq,
                    stream_id=event.stream_id,
                )
        if not spans:
            return args
        self._spans.update(spans)
        traced, per_entry = args[:common_args], args[common_args:]
        for n, i in enumerate(run):
            traced += per_entry[4 * n : 4 * n + 4]
            traced.append(tracing.inject(spans[i]) if i in spans else "")
        return traced

    def failed(self, error: BaseException) -> None:
        """The calls could not run (Redis away): the route spans end failed."""
        for current in self._spans.values():
            tracing.failed(current, error)
            current.end()
        self._spans.clear()

    def results(self, replies: Sequence) -> list:
        """Each delivery's result, in the batch's order, from the calls' replies: route.lua's
        (APPLIED, DUPLICATE, DEFERRED) or dead_letter.lua's, or the exception of the call or of
        the entry (CorruptKey)."""
        results: list = [None] * sum(len(indexes) for indexes in self._settles)
        for call, indexes, reply in zip(self.calls, self._settles, replies):
            if call.script is ROUTE and not isinstance(reply, Exception):
                for i, entry_reply in zip(indexes, reply):
                    results[i] = classified(entry_reply)
            else:
                for i in indexes:
                    results[i] = reply
        if self._spans:
            self._end_spans(results)
        return results

    def _end_spans(self, results: list) -> None:
        for i, current in self._spans.items():
            result = results[i]
            if isinstance(result, BaseException):
                tracing.failed(current, result)
            else:
                current.set_attribute("outcome", ROUTE_OUTCOMES.get(result, str(result)))
            current.end()
        self._spans.clear()


def count_route_results(labels: tuple[str, str], result, n: int = 1, *, retry: bool = False) -> None:
    """Metrics of n route.lua results of one shard (a retried deferral is not a new one)."""
    if result == APPLIED:
        metrics.child(metrics.APPLIED, *labels).inc(n)
    elif result == DUPLICATE:
        metrics.child(metrics.DUPLICATES, *labels, "L2").inc(n)
    elif result == DEFERRED and not retry:
        metrics.child(metrics.DEFERRED, *labels).inc(n)
