"""Poison entries end as dead letters with their reason while the router keeps going; once
their cause is fixed, the redrive delivers them."""

from io import StringIO

from django.core.management import call_command

from eventbus import publish_event, publish_events
from eventbus.keys import JobKeys, dead_letter_key
from eventbus.reclaimer import Reclaimer
from eventbus.router import Router

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
