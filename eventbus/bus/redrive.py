"""Re-drive dead letters: put them back on their shard stream, so that the router applies them
once their cause is fixed (the missing predecessor was applied, the bug deployed...).

They go back with XADD, not publish_event: their L1 dedup key may still exist (they were
published once), while route.lua never applied them, so the router takes them as new. Each is
re-added and deleted from the dead letters in one script; per shard in seq order, then by
original stream id, so a job's entries come back in the order the router needs. Dead letters
that are malformed in themselves (not JSON, missing fields, an original_stream_id that is not a
stream id) stay where they are, each named in a warning: re-adding them would only dead-letter
them again. Only an entry's own fields go back (entries.FIELDS), nothing else a letter holds.

Every field of a letter is read as anyone who can write to Redis may have left it: not UTF-8,
missing, huge. The text kept of each (reason, original_stream_id, raw fields) is cut to a size
a page and a log line can show; counts are parsed only when they are short digit strings.

`dead_letters` reads them without re-driving (the admin's list: eventbus.admin).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from eventbus.bus.delivery import streams_for
from eventbus.bus.events import FIELDS, MalformedEntry, original_fields, parse_entry
from eventbus.bus.scripts import REDRIVE, run_pipelined
from eventbus.conf import eventbus_settings
from eventbus.redis.clients import get_redis

logger = logging.getLogger(__name__)

PAGE = 1000
# A Redis stream id, <milliseconds>-<sequence>, both 64-bit: at most 20 digits each.
STREAM_ID = re.compile(rb"[0-9]{1,20}-[0-9]{1,20}")
# How much of a letter's text is kept: a reason, an id, a raw field's name and value.
SHOWN_CHARS = 200
SHOWN_ID_CHARS = 80
SHOWN_FIELDS = 20


def shortened(raw: bytes | str, limit: int = SHOWN_CHARS) -> str:
    """Bytes (or text) from Redis as text a page, a terminal or a log line can show: decoded (not
    UTF-8: replaced), control characters escaped (a newline as \\n), cut to `limit` characters."""
    text = raw[: limit * 4] if isinstance(raw, str) else raw[: limit * 4].decode(errors="replace")
    if len(text) > limit or len(raw) > limit * 4:  # at most 4 bytes a character
        text = text[:limit] + "…"
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclass
class DeadLetter:
    stream_key: str
    dead_id: str
    original_stream_id: str
    reason: str
    fields: dict  # the original entry's
    seq: int | None = None
    job_id: str | None = None
    malformed: str | None = None
    new_id: str | None = None  # its id back in the shard stream
    domain: str = ""
    shard: int = 0
    deliveries: int | None = None  # how many times the router had it (None: it refused it at once)
    position: tuple[int, int] = (0, 0)  # its original stream id, parsed (malformed: 0-0)
    raw: dict = field(default_factory=dict)  # every field as Redis holds it
    dead_key: str = ""  # the dead-letter stream it is in

    @property
    def dead_at_ms(self) -> int:
        """When it was dead-lettered (its id in the dead letters is a Redis stream timestamp)."""
        return int(self.dead_id.partition("-")[0] or 0)

    @property
    def order(self) -> tuple:
        return (self.seq or 0, *self.position)

    @property
    def raw_fields(self) -> list[tuple[str, str]]:
        """Its first SHOWN_FIELDS fields as text, shortened: what a malformed letter is shown as."""
        return [
            (shortened(k, SHOWN_ID_CHARS), shortened(v)) for k, v in list(self.raw.items())[:SHOWN_FIELDS]
        ]


def read_dead_letters(client, dead_key: str) -> list[tuple[str, dict]]:
    letters: list[tuple[str, dict]] = []
    start = "-"
    while True:
        page = client.xrange(dead_key, start, "+", count=PAGE)
        letters.extend((entry_id.decode(), fields) for entry_id, fields in page)
        if len(page) < PAGE:
            return letters
        start = "(" + page[-1][0].decode()


def dead_letter(stream, dead_id: str, fields: dict) -> DeadLetter:
    """One dead letter of the shard stream `stream` (eventbus.bus.delivery.streams_for), parsed;
    `malformed` says why it cannot go back."""
    original_id = fields.get(b"original_stream_id")
    deliveries = fields.get(b"deliveries", b"")
    letter = DeadLetter(
        stream.key,
        dead_id,
        shortened(original_id or b"", SHOWN_ID_CHARS),
        shortened(fields.get(b"reason", b"")),
        original_fields(fields),
        domain=stream.domain,
        shard=stream.shard,
        # 18 digits: an int, never a 4,300-digit ValueError.
        deliveries=int(deliveries) if re.fullmatch(rb"[0-9]{1,18}", deliveries) else None,
        raw=fields,
        dead_key=stream.dead_letters,
    )
    if original_id is None:
        letter.malformed = "no original_stream_id"
    elif not STREAM_ID.fullmatch(original_id):
        letter.malformed = f"original_stream_id {original_id[:40]!r} is not a stream id <ms>-<seq>"
    else:
        ms, _, n = original_id.partition(b"-")
        letter.position = (int(ms), int(n))
        try:
            event = parse_entry(stream.domain, stream.shard, letter.original_stream_id, letter.fields)
            letter.seq, letter.job_id = event.seq, shortened(event.job_id, SHOWN_ID_CHARS)
        except MalformedEntry as exc:
            letter.malformed = shortened(str(exc))
    return letter


def dead_letters(domain: str, *, client=None, limit: int | None = None) -> list[DeadLetter]:
    """The domain's dead letters, shard by shard, each shard's in the order a redrive re-adds
    them; `limit`: at most the first (oldest) `limit` of each shard."""
    client = client or get_redis()
    report = []
    for stream in streams_for([domain]):
        if limit is None:
            raw = read_dead_letters(client, stream.dead_letters)
        else:
            raw = [(i.decode(), f) for i, f in client.xrange(stream.dead_letters, "-", "+", count=limit)]
        letters = [dead_letter(stream, dead_id, fields) for dead_id, fields in raw]
        report.extend(sorted(letters, key=lambda letter: letter.order))
    return report


def redrive(domain: str, *, dry_run: bool = False, client=None) -> list[DeadLetter]:
    """Every dead letter of the domain; the well-formed ones re-added (new_id) unless dry_run."""
    client = client or get_redis()
    report = []
    for stream in streams_for([domain]):
        letters = sorted(
            (
                dead_letter(stream, dead_id, fields)
                for dead_id, fields in read_dead_letters(client, stream.dead_letters)
            ),
            key=lambda letter: letter.order,
        )
        todo = [letter for letter in letters if not letter.malformed]
        for letter in letters:
            if letter.malformed:
                logger.warning(
                    "dead letter %s of %s kept: malformed (%s)",
                    letter.dead_id,
                    letter.dead_key,
                    letter.malformed,
                )
        if todo and not dry_run:
            calls = [
                REDRIVE.call(
                    (stream.key, stream.dead_letters),
                    (
                        letter.dead_id,
                        eventbus_settings.STREAM_MAXLEN,
                        *(item for name in FIELDS for item in (name, letter.fields[name])),
                    ),
                )
                for letter in todo
            ]
            for letter, new_id in zip(todo, run_pipelined(client, calls)):
                if isinstance(new_id, Exception):
                    raise new_id
                letter.new_id = new_id.decode() if isinstance(new_id, bytes) else new_id
        report.extend(letters)
    return report
