"""Re-drive dead letters: put them back on their shard stream, so that the router applies them
once their cause is fixed (the missing predecessor was applied, the bug deployed...).

They go back with XADD, not publish_event: their L1 dedup key may still exist (they were
published once), while route.lua never applied them, so the router takes them as new. Each is
re-added and deleted from the dead letters in one script; per shard in seq order, then by
original stream id, so a job's entries come back in the order the router needs. Dead letters
that are malformed in themselves (not JSON, missing fields) stay where they are: re-adding
them would only dead-letter them again.
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


def redrive(domain: str, *, dry_run: bool = False, client=None) -> list[DeadLetter]:
    """Every dead letter of the domain; the well-formed ones re-added (new_id) unless dry_run."""
    client = client or get_redis()
    report = []
    for stream in streams_for([domain]):
        letters = []
        for dead_id, fields in read_dead_letters(client, stream.dead_letters):
            letter = DeadLetter(
                stream.key,
                dead_id,
                fields.get(b"original_stream_id", b"0-0").decode(),
                fields.get(b"reason", b"").decode(errors="replace"),
                original_fields(fields),
            )
            try:
                event = parse_entry(domain, stream.shard, letter.original_stream_id, letter.fields)
                letter.seq, letter.job_id = event.seq, event.job_id
            except MalformedEntry as exc:
                letter.malformed = str(exc)
            letters.append(letter)
        letters.sort(key=lambda letter: letter.order)
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
