"""Stream entries and the events they carry: the one place that knows their fields and JSON.

A stream entry (written by publish.lua) has the fields job_id, domain, stage, seq, prev_seq and
data (JSON text), and `tp` when its publish was traced (exactly_once.tracing: the publish span's
W3C traceparent). The event JSON stored as state and history and sent on the job channel is

    {"type":"event","seq":12,"job_id":"...","domain":"scan","stage":"vision","data":{...},
     "prev_seq":11,"stream_id":"1700000000000-0"}

`seq` comes first: route.lua reads the stored state's seq with a pattern, not a JSON decoder.
The object is the gateway's WebSocket frame as it is; prev_seq (the job's event before it, 0
for the first) lets a consumer of the channel see a gap. A router that traces adds a last member
`"tp":"<traceparent>"` (its route span's) to the channel's copy of an entry that had one, never
to the state or the history: the gateway strips it before it sends the frame (gateway.hub).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _quote

from django.core.serializers.json import DjangoJSONEncoder

from eventbus.bus.keys import JobKeys
from exactly_once.tracing import TRACING

FIELDS = (b"job_id", b"domain", b"stage", b"seq", b"prev_seq", b"data")
# Fields a dead letter adds to the original ones (stripped again by the redrive).
DEAD_LETTER_FIELDS = (b"reason", b"original_stream_id", b"deliveries")


class _DataEncoder(DjangoJSONEncoder):
    """Compact JSON; NaN and Infinity refused (not JSON: a browser's JSON.parse fails on them).
    What Django's encoder takes besides JSON's own types (Decimal as a string, datetime, date,
    time and timedelta as ISO 8601, UUID and lazy strings as strings) is taken: its `default`
    runs for those only, so plain data costs nothing more."""

    def __init__(self):
        super().__init__(separators=(",", ":"), allow_nan=False)


_data_encoder = _DataEncoder()
try:
    from json.encoder import c_make_encoder  # type: ignore[attr-defined]

    # The C encoder JSONEncoder.encode() builds anew for every call, built once: a third of the
    # cost of encoding a small event's data. Without the circular-reference check (markers
    # None), a cycle ends in RecursionError instead of ValueError; encode_data says which.
    _c_encode = c_make_encoder(None, _data_encoder.default, _quote, None, ":", ",", False, False, False)
except (ImportError, TypeError):  # pragma: no cover - an interpreter without the C accelerator
    _c_encode = None


def encode_data(data) -> str:
    """An event's data as compact JSON; TypeError or ValueError when it is not JSON."""
    if _c_encode is None:  # pragma: no cover
        return _data_encoder.encode(data)
    try:
        return "".join(_c_encode(data, 0))
    except RecursionError:
        raise ValueError("Circular reference detected, or nested too deep") from None


def event_head(*, domain: str, job_id: str, stage: str, seq: int, data_json: str) -> str:
    """The event JSON up to its data: prev_seq, the stream id and the closing brace follow."""
    return (
        f'{{"type":"event","seq":{seq},"job_id":{_quote(job_id)},"domain":{_quote(domain)},'
        f'"stage":{_quote(stage)},"data":{data_json}'
    )


def event_json(head: str, prev_seq: int, stream_id: str) -> str:
    """The whole event JSON: publish.lua ends the head the same way."""
    return f'{head},"prev_seq":{prev_seq},"stream_id":"{stream_id}"}}'


# The largest seq: a JSON number every client reads exactly (JavaScript's safe integers). A
# longer field is refused on its length first: int() raises ValueError past 4,300 digits, which
# is no reason for an entry to escape its dead letter (or for a client's last_seq to drop its
# socket without a close code).
MAX_SEQ = 2**53
MAX_SEQ_DIGITS = len(str(MAX_SEQ))


class MalformedEntry(ValueError):
    """A stream entry the router cannot apply, ever: it goes to the dead letters with this reason."""


@dataclass(slots=True)
class RoutedEvent:
    """A well-formed entry of a shard stream, ready for route.lua."""

    keys: JobKeys
    stream_id: str
    seq: int
    prev_seq: int
    event: str  # the event JSON
    tp: str = ""  # the publish span's traceparent (tracing), "" when the entry has none

    @property
    def job_id(self) -> str:
        return self.keys.job_id


def _int_field(fields: dict, name: bytes) -> int:
    raw = fields[name]
    if not raw.isdigit() or len(raw) > MAX_SEQ_DIGITS or int(raw) > MAX_SEQ:
        raise MalformedEntry(f"{name.decode()} {raw[:40]!r} is not a non-negative integer <= 2**53")
    return int(raw)


def parse_entry(domain: str, shard: int, stream_id: str, fields: dict[bytes, bytes]) -> RoutedEvent:
    """The event of one entry of stream (domain, shard); MalformedEntry says why there is none."""
    missing = [name.decode() for name in FIELDS if name not in fields]
    if missing:
        raise MalformedEntry(f"missing field(s): {', '.join(missing)}")
    try:
        job_id, entry_domain, stage, data = (
            fields[name].decode() for name in (b"job_id", b"domain", b"stage", b"data")
        )
    except UnicodeDecodeError as exc:
        raise MalformedEntry(f"a field is not UTF-8: {exc}") from None
    if entry_domain != domain:
        raise MalformedEntry(f"domain {entry_domain!r} in the stream of domain {domain!r}")
    if not job_id or not stage:
        raise MalformedEntry("empty job_id or stage")
    seq, prev_seq = _int_field(fields, b"seq"), _int_field(fields, b"prev_seq")
    if not 0 <= prev_seq < seq:
        raise MalformedEntry(f"seq {seq} must be above prev_seq {prev_seq} and 0")
    # All of a job's keys are in its shard's slot; an entry in another shard's stream would
    # make route.lua touch two slots (CROSSSLOT on a cluster).
    keys = JobKeys(domain, job_id)
    if keys.shard != shard:
        raise MalformedEntry(f"job {job_id!r} belongs to shard {keys.shard}, found in shard {shard}")
    try:
        json.loads(data)
    except ValueError as exc:
        raise MalformedEntry(f"data is not JSON: {exc}") from None
    except RecursionError:
        raise MalformedEntry("data is not JSON: nested too deep") from None
    head = event_head(domain=domain, job_id=job_id, stage=stage, seq=seq, data_json=data)
    routed = RoutedEvent(keys, stream_id, seq, prev_seq, event_json(head, prev_seq, stream_id))
    if TRACING and b"tp" in fields:
        routed.tp = fields[b"tp"].decode(errors="replace")
    return routed


def original_fields(dead_letter: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """A dead letter's fields as the entry had them in its shard stream."""
    return {k: v for k, v in dead_letter.items() if k not in DEAD_LETTER_FIELDS}
