"""The delivery of stream entries, what the router and the reclaimer share: the shard streams,
a delivered entry, and the script calls that settle it (route.lua applies and acks it,
dead_letter.lua moves and acks it). (gateway/routing.py is Channels' URL routing.)"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import metrics
from .conf import eventbus_settings
from .entries import MalformedEntry, RoutedEvent, parse_entry
from .keys import UnknownDomain, dead_letter_key, shard_count, stream_key
from .keys import domains as all_domains
from .redis import publish_command
from .scripts import DEAD_LETTER, ROUTE, ScriptCall

# route.lua's replies.
DUPLICATE, APPLIED, DEFERRED = 0, 1, 2


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
    """Every shard stream of these domains (default: every domain, keys.domains()); an entry
    `domain:shard` names one shard (routers per shard on a Redis Cluster)."""
    streams: list[Stream] = []
    for name in list(domains) if domains else all_domains():
        domain, colon, shard = str(name).partition(":")
        count = shard_count(domain)  # UnknownDomain
        if not colon:
            streams.extend(Stream(domain, n) for n in range(count))
        elif shard.isdigit() and int(shard) < count:
            streams.append(Stream(domain, int(shard)))
        else:
            raise UnknownDomain(f"No shard {name!r}: domain {domain!r} has shards 0-{count - 1}")
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

    def route_call(self, group: str) -> ScriptCall:
        event, settings = self.routed, eventbus_settings
        keys = event.keys
        return ROUTE.call(
            (
                keys.applied,
                keys.router_published(event.seq),
                keys.state,
                keys.history,
                self.stream.key,
                keys.channel,
            ),
            (
                event.seq,
                event.prev_seq,
                event.event,
                publish_command(),
                group,
                self.stream_id,
                settings.ROUTER_DEDUP_TTL,
                settings.STATE_TTL,
                settings.HISTORY_TTL,
                settings.HISTORY_MAXLEN,
            ),
        )

    def dead_letter_call(self, group: str, reason: str, deliveries: int | None = None) -> ScriptCall:
        pairs = [item for pair in self.fields.items() for item in pair]
        return DEAD_LETTER.call(
            (self.stream.key, self.stream.dead_letters),
            (group, self.stream_id, reason, "" if deliveries is None else deliveries, *pairs),
        )

    def settle_call(self, group: str) -> ScriptCall:
        """The call to make on first sight: dead-letter a malformed entry, route the others."""
        if self.malformed:
            return self.dead_letter_call(group, self.malformed)
        return self.route_call(group)

    def never_applied_reason(self) -> str:
        return f"predecessor seq {self.routed.prev_seq} never applied"


def count_route_results(labels: tuple[str, str], result, n: int = 1, *, retry: bool = False) -> None:
    """Metrics of n route.lua results of one shard (a retried deferral is not a new one)."""
    if result == APPLIED:
        metrics.child(metrics.APPLIED, *labels).inc(n)
    elif result == DUPLICATE:
        metrics.child(metrics.DUPLICATES, *labels, "L2").inc(n)
    elif result == DEFERRED and not retry:
        metrics.child(metrics.DEFERRED, *labels).inc(n)
