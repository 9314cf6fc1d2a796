"""Re-drive dead letters: put them back on their shard stream, so that the router applies them
once their cause is fixed (the missing predecessor was applied, the bug deployed...).

They go back with XADD, not publish_event: their L1 dedup key may still exist (they were
published once), while route.lua never applied them, so the router takes them as new. Each is
re-added and deleted from the dead letters in one script; per shard in seq order, then by
original stream id, so a job's entries come back in the order the router needs. Dead letters
that are malformed in themselves (not JSON, missing fields) stay where they are: re-adding
them would only dead-letter them again.

`dead_letters` reads them without re-driving (the admin's list: eventbus.admin).
"""

from __future__ import annotations

from dataclasses import dataclass

from .conf import eventbus_settings
from .delivery import streams_for
from .entries import MalformedEntry, original_fields, parse_entry
from .redis import get_redis
from .scripts import REDRIVE, run_pipelined

PAGE = 1000


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

    @property
    def dead_at_ms(self) -> int:
        """When it was dead-lettered (its id in the dead letters is a Redis stream timestamp)."""
        return int(self.dead_id.partition("-")[0] or 0)

    @property
    def order(self) -> tuple:
        ms, _, n = self.original_stream_id.partition("-")
        return (self.seq or 0, int(ms or 0), int(n or 0))


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
    """One dead letter of the shard stream `stream` (eventbus.delivery.streams_for), parsed."""
    deliveries = fields.get(b"deliveries", b"")
    letter = DeadLetter(
        stream.key,
        dead_id,
        fields.get(b"original_stream_id", b"0-0").decode(errors="replace"),
        fields.get(b"reason", b"").decode(errors="replace"),
        original_fields(fields),
        domain=stream.domain,
        shard=stream.shard,
        deliveries=int(deliveries) if deliveries.isdigit() else None,
    )
    try:
        event = parse_entry(stream.domain, stream.shard, letter.original_stream_id, letter.fields)
        letter.seq, letter.job_id = event.seq, event.job_id
    except MalformedEntry as exc:
        letter.malformed = str(exc)
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
        if todo and not dry_run:
            calls = [
                REDRIVE.call(
                    (stream.key, stream.dead_letters),
                    (
                        letter.dead_id,
                        eventbus_settings.STREAM_MAXLEN,
                        *(item for pair in letter.fields.items() for item in pair),
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
