"""Poison entries end as dead letters with their reason while the router keeps going; once
their cause is fixed, the redrive delivers them."""

import logging
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from eventbus import publish_event, publish_events
from eventbus.bus.keys import JobKeys, dead_letter_key
from eventbus.bus.reclaimer import Reclaimer
from eventbus.bus.router import Router

from .helpers import dead_letters, history_seqs, pending


def route():
    Router(burst=True, consumer="r1").run()


def reclaim():
    Reclaimer(burst=True, min_idle_ms=0, max_deliveries=1).run()


def redrive(**options) -> str:
    out = StringIO()
    call_command("eventbus_redrive", domain="scan", stdout=out, **options)
    return out.getvalue()


def test_poison_entries_are_dead_lettered_and_redriven_once_fixed(redis_client):
    publish_events([("scan", "job-p", "vision", seq, {"seq": seq}) for seq in (10, 11, 12, 13)])
    keys = JobKeys("scan", "job-p")
    [_, (lost_id, lost_fields), _, _] = redis_client.xrange(keys.stream)
    redis_client.xdel(keys.stream, lost_id)  # seq 11 is lost (say, trimmed)
    not_json = redis_client.xadd(
        keys.stream,
        {**{k.decode(): v for k, v in lost_fields.items()}, "job_id": "job-p", "seq": "99", "data": "{oops"},
    ).decode()

    route()  # 10 applied, the poison dead-lettered, 12 and 13 wait for 11
    publish_event("scan", "job-q", "vision", 10, {})  # the router keeps going
    route()
    assert history_seqs(redis_client, "scan", "job-p") == [10]
    assert history_seqs(redis_client, "scan", "job-q") == [10]

    reclaim()  # 12 and 13 delivered twice > max 1: dead letters
    letters = dead_letters(redis_client, "scan", keys.shard)
    assert [(letter["seq"], letter["reason"]) for letter in letters] == [
        (
            "99",
            "data is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        ("12", "predecessor seq 11 never applied"),
        ("13", "predecessor seq 12 never applied"),
    ]
    assert letters[0]["original_stream_id"] == not_json
    assert pending(redis_client, keys.stream) == 0

    dry = redis_client.xlen(dead_letter_key("scan", keys.shard))
    out = redrive(dry_run=True)
    assert "would re-drive 2 of 3 dead letter(s)" in out and "kept" in out
    assert redis_client.xlen(dead_letter_key("scan", keys.shard)) == dry

    redrive()  # the cause is not fixed: they only come back to the dead letters
    route()
    reclaim()
    assert history_seqs(redis_client, "scan", "job-p") == [10]
    assert sorted(letter["seq"] for letter in dead_letters(redis_client, "scan")) == ["12", "13", "99"]

    redis_client.xadd(keys.stream, lost_fields)  # fixed: the lost entry is back
    route()
    assert history_seqs(redis_client, "scan", "job-p") == [10, 11]
    out = redrive()
    assert "re-drove 2 of 3 dead letter(s)" in out
    route()
    assert history_seqs(redis_client, "scan", "job-p") == [10, 11, 12, 13]
    [kept] = dead_letters(redis_client, "scan")
    assert kept["seq"] == "99"  # malformed in itself: stays, for a human
    assert pending(redis_client, keys.stream) == 0


def test_redrive_puts_a_jobs_dead_letters_back_in_seq_order(redis_client):
    """Dead letters of one job that died in another order (several reclaim passes)."""
    publish_events([("scan", "job-o", "vision", seq, {}) for seq in (10, 11, 12)])
    keys = JobKeys("scan", "job-o")
    entries = redis_client.xrange(keys.stream)
    redis_client.delete(keys.stream)
    dead = dead_letter_key("scan", keys.shard)
    for entry_id, fields in reversed(entries):
        redis_client.xadd(dead, {**fields, b"reason": b"test", b"original_stream_id": entry_id})

    redrive()
    route()

    assert history_seqs(redis_client, "scan", "job-o") == [10, 11, 12]
    assert dead_letters(redis_client, "scan") == []


# Dead letters nobody's router wrote: anyone who can write to Redis can add one -----------------

# A well-formed letter's fields but for what each case changes (None: the field left out).
FORGED = {
    "original_stream_id not an id": {b"original_stream_id": b"not-an-id"},
    "original_stream_id of three parts": {b"original_stream_id": b"1-2-3"},
    "original_stream_id in other digits": {b"original_stream_id": "١-٠".encode()},
    "original_stream_id past 64 bits": {b"original_stream_id": b"9" * 30 + b"-0"},
    "original_stream_id missing": {b"original_stream_id": None},
    "original_stream_id huge": {b"original_stream_id": b"7" * 100_000},
    "job_id not UTF-8": {b"job_id": b"\xff\xfe<b>"},
    "data missing": {b"data": None},
}


def forge(redis_client, **changes) -> tuple[str, str]:
    """A dead letter of job-f (seq 10) in its shard's dead letters, changed as told; returns
    (the dead-letter stream, its id there)."""
    keys = JobKeys("scan", "job-f")
    fields = {
        b"job_id": b"job-f",
        b"domain": b"scan",
        b"stage": b"vision",
        b"seq": b"10",
        b"prev_seq": b"0",
        b"data": b"{}",
        b"reason": b"test",
        b"original_stream_id": b"1-0",
        b"deliveries": b"3",
    }
    for name, value in changes.items():
        field = name.encode() if isinstance(name, str) else name
        if value is None:
            del fields[field]
        else:
            fields[field] = value
    dead = dead_letter_key("scan", keys.shard)
    return dead, redis_client.xadd(dead, fields).decode()


def redrive_streams(**options) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("eventbus_redrive", domain="scan", stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


@pytest.mark.parametrize("changes", FORGED.values(), ids=FORGED.keys())
def test_a_malformed_dead_letter_is_named_and_kept_while_the_others_go_back(redis_client, caplog, changes):
    publish_events([("scan", "job-o", "vision", seq, {}) for seq in (10, 11)])
    keys = JobKeys("scan", "job-o")
    entries = redis_client.xrange(keys.stream)
    redis_client.delete(keys.stream)
    dead = dead_letter_key("scan", keys.shard)
    for entry_id, fields in entries:
        redis_client.xadd(dead, {**fields, b"reason": b"test", b"original_stream_id": entry_id})
    forged_in, forged_id = forge(redis_client, **{k.decode(): v for k, v in changes.items()})

    with caplog.at_level(logging.WARNING, logger="eventbus.bus.redrive"):
        out, err = redrive_streams()

    assert "scan: re-drove 2 of 3 dead letter(s); 1 malformed kept." in out
    [warning] = err.splitlines()
    assert warning.startswith(f"kept     {forged_in} {forged_id}: malformed (") and len(warning) < 400
    assert f"dead letter {forged_id} of {forged_in} kept: malformed" in caplog.text
    route()
    assert history_seqs(redis_client, "scan", "job-o") == [10, 11]  # the others went back
    [(kept_id, _)] = redis_client.xrange(forged_in)
    assert kept_id.decode() == forged_id  # the forged one stays, as it was


def test_a_letter_of_huge_or_odd_counts_and_reasons_is_redriven_and_reported_shortly(redis_client):
    """Fields the redrive does not need (deliveries, reason, an extra field) are read, never
    trusted: a count of 5,000 digits, a reason of 100,000 characters with a newline and a byte
    that is not UTF-8, and 10,000 extra fields (more than a Lua script can unpack) do not stop
    the letter going back, with only its own fields."""
    dead, _ = forge(
        redis_client,
        deliveries=b"9" * 5000,
        reason=b"\xffline\n" + b"x" * 100_000,
        **{f"extra{n}": b"1" for n in range(10_000)},
    )
    out, err = redrive_streams(dry_run=True)
    [would] = [line for line in out.splitlines() if line.startswith("would")]
    assert "(\ufffdline\\nxxx" in would and len(would) < 400 and err == ""
    out, err = redrive_streams()
    assert "scan: re-drove 1 of 1 dead letter(s); 0 malformed kept." in out and err == ""
    assert redis_client.xlen(dead) == 0
    [(_, fields)] = redis_client.xrange(JobKeys("scan", "job-f").stream)
    assert set(fields) == {b"job_id", b"domain", b"stage", b"seq", b"prev_seq", b"data"}
    route()
    assert history_seqs(redis_client, "scan", "job-f") == [10]


def test_the_command_says_so_when_redis_does_not_answer(redis_client, eventbus_settings_override):
    from config.redis_server import free_port

    closed = f"redis://127.0.0.1:{free_port()}/0"
    with (
        eventbus_settings_override(REDIS_URL=closed),
        pytest.raises(CommandError, match="Redis did not answer"),
    ):
        redrive()
