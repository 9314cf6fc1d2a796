"""A key of the bus holding a value of the wrong type (another program wrote it, a bug, a
botched repair): every script checks its keys before it writes anything, so a corrupt key costs
a retry or a dead letter with its reason, never an event. Redis keeps what a script wrote before
it failed: a script that wrote first and failed later would mark an event applied (or acked, or
published) without its effect. Once the key is repaired (deleted), the entry is delivered once.

Each script with each of its keys corrupted: publish.lua, route.lua, dead_letter.lua, redrive.lua.
"""

import logging
import re

import pytest

from eventbus import publish_event, publish_events
from eventbus.bus.keys import JobKeys, dead_letter_key
from eventbus.bus.publish import CorruptKey
from eventbus.bus.reclaimer import Reclaimer
from eventbus.bus.redrive import redrive
from eventbus.bus.router import Router
from eventbus.bus.scripts import REDRIVE, run_pipelined
from eventbus.conf import eventbus_settings

from .helpers import Subscriber, dead_letters, history, history_seqs, job_events, pending

JOB = "job-corrupt"
ASIDE = ":aside"


@pytest.fixture
def subscriber(redis_client):
    subscriber = Subscriber(redis_client)
    yield subscriber
    subscriber.close()


def corrupt(client, key: str, wrong: str) -> None:
    """Put a value of the wrong type ("list" or "string") at key. A stream is moved aside first,
    with its group and pending entries, for repair() to bring back."""
    if client.type(key) == b"stream":
        client.rename(key, key + ASIDE)
    client.delete(key)
    if wrong == "list":
        client.rpush(key, "corrupt")
    else:
        client.set(key, "corrupt")


def repair(client, key: str) -> None:
    client.delete(key)
    if client.exists(key + ASIDE):
        client.rename(key + ASIDE, key)


def snapshot(client) -> dict:
    """Every key and its serialized value (with a stream's groups and pending entries): what
    "nothing written" compares."""
    return {key: client.dump(key) for key in sorted(client.keys("*"))}


def corrupt_message(key: str, wrong: str, expected: str) -> str:
    return re.escape(f"CORRUPT {key} holds a {wrong}, not a {expected}")


def read_first(router: Router, keys: JobKeys) -> list:
    """The router reads the job's entry (it is pending now) and has not settled it yet."""
    router.ensure_groups()
    batch = router.read({keys.stream: ">"}, None)
    assert len(batch) == 1
    return batch


def published_seqs(subscriber) -> list[int]:
    """Every seq of the job published on its channel so far."""
    return [event["seq"] for event in subscriber.drain(quiet=0.2) if event["job_id"] == JOB]


def assert_delivered_once(client, subscriber) -> None:
    """The job's seq 10 is in the history and was published, each exactly once."""
    events = history(client, "scan", JOB)
    assert [e["seq"] for e in events] == [10]
    assert events[0]["data"] == {"n": 10}
    assert published_seqs(subscriber) == [10]
    keys = JobKeys("scan", JOB)
    assert int(client.get(keys.applied)) == 10
    assert client.exists(keys.router_published(10))
    assert pending(client, keys.stream) == 0


# --- publish.lua (L1) ---------------------------------------------------------------------------

PUBLISH_KEYS = [
    pytest.param(lambda keys: keys.published("vision", 10), "list", "string", id="dedup"),
    pytest.param(lambda keys: keys.last_published, "list", "string", id="last-seq"),
    pytest.param(lambda keys: keys.state, "list", "string", id="state"),
    pytest.param(lambda keys: keys.stream, "string", "stream", id="stream"),
]


@pytest.mark.parametrize("key_of, wrong, expected", PUBLISH_KEYS)
def test_publish_with_a_corrupt_key_raises_and_writes_nothing(
    redis_client, subscriber, key_of, wrong, expected
):
    keys = JobKeys("scan", JOB)
    key = key_of(keys)
    corrupt(redis_client, key, wrong)
    before = snapshot(redis_client)

    with pytest.raises(CorruptKey, match=corrupt_message(key, wrong, expected)):
        publish_event("scan", JOB, "vision", 10, {"n": 10})

    assert snapshot(redis_client) == before  # no dedup key without its entry, no state...
    repair(redis_client, key)
    assert publish_event("scan", JOB, "vision", 10, {"n": 10}) is True
    assert publish_event("scan", JOB, "vision", 10, {"n": 10}) is False
    Router(burst=True, consumer="r1").run()
    assert_delivered_once(redis_client, subscriber)


def test_a_last_seq_key_holding_no_seq_is_corrupt(redis_client):
    keys = JobKeys("scan", JOB)
    redis_client.set(keys.last_published, "ten")
    with pytest.raises(CorruptKey, match=re.escape(f'CORRUPT {keys.last_published} holds "ten", not a seq')):
        publish_event("scan", JOB, "vision", 10, {"n": 10})
    assert job_events(redis_client, "scan", JOB) == []


def test_a_batch_stops_at_a_corrupt_key_and_is_published_again_once_repaired(redis_client):
    """The job's events after the failed one are held back: published, they would step over it
    (prev_seq 10 for seq 12), and seq 11 could never be published after them."""
    keys, other = JobKeys("scan", JOB), "job-fine"
    batch = [("scan", JOB, "vision", seq, {"n": seq}) for seq in (10, 11, 12)]
    batch.append(("scan", other, "vision", 10, {}))
    corrupt(redis_client, keys.published("vision", 11), "list")

    with pytest.raises(CorruptKey, match=re.escape(keys.published("vision", 11))):
        publish_events(batch)

    assert job_events(redis_client, "scan", JOB) == [("vision", 10)]
    assert job_events(redis_client, "scan", other) == [("vision", 10)]  # another job goes on
    repair(redis_client, keys.published("vision", 11))
    assert publish_events(batch) == [False, True, True, False]
    Router(burst=True, consumer="r1").run()
    events = history(redis_client, "scan", JOB)
    assert [(e["seq"], e["prev_seq"]) for e in events] == [(10, 0), (11, 10), (12, 11)]


# --- route.lua (L2, L3) -------------------------------------------------------------------------

ROUTE_KEYS = [
    pytest.param(lambda keys: keys.applied, "list", "string", id="applied-seq"),
    pytest.param(lambda keys: keys.router_published(10), "list", "string", id="router-dedup"),
    pytest.param(lambda keys: keys.state, "list", "string", id="state"),
    pytest.param(lambda keys: keys.history, "string", "zset", id="history"),
    pytest.param(lambda keys: keys.stream, "string", "stream", id="stream"),
]


@pytest.mark.parametrize("key_of, wrong, expected", ROUTE_KEYS)
def test_route_with_a_corrupt_key_writes_nothing_and_the_entry_is_retried(
    redis_client, subscriber, caplog, key_of, wrong, expected
):
    publish_event("scan", JOB, "vision", 10, {"n": 10})
    keys = JobKeys("scan", JOB)
    key = key_of(keys)
    router = Router(consumer="r1", burst=True)
    batch = read_first(router, keys)
    corrupt(redis_client, key, wrong)
    before = snapshot(redis_client)

    with caplog.at_level(logging.ERROR, logger="eventbus.bus.router"):
        assert router.settle(batch) == set()

    # Not applied, not in the history, not published, not acked: nothing written at all.
    assert snapshot(redis_client) == before
    assert published_seqs(subscriber) == []
    assert re.search(corrupt_message(key, wrong, expected), caplog.text)
    repair(redis_client, key)
    assert pending(redis_client, keys.stream) == 1
    Reclaimer(burst=True, min_idle_ms=0).run()  # the retry
    assert_delivered_once(redis_client, subscriber)
    assert dead_letters(redis_client, "scan") == []


# The stream key is not here: an entry whose stream is corrupt cannot be claimed either (the
# test above covers it: it waits, pending, until its stream is back).
@pytest.mark.parametrize("key_of, wrong, expected", ROUTE_KEYS[:4])
def test_route_with_a_corrupt_key_is_dead_lettered_with_its_reason_and_redriven_once_repaired(
    redis_client, subscriber, key_of, wrong, expected
):
    publish_event("scan", JOB, "vision", 10, {"n": 10})
    keys = JobKeys("scan", JOB)
    key = key_of(keys)
    router = Router(consumer="r1", burst=True)
    batch = read_first(router, keys)
    corrupt(redis_client, key, wrong)
    router.settle(batch)

    Reclaimer(burst=True, min_idle_ms=0, max_deliveries=1).run()  # delivery 2 > 1, and it fails

    [letter] = dead_letters(redis_client, "scan")
    assert re.fullmatch("route script failed: " + corrupt_message(key, wrong, expected), letter["reason"])
    assert (letter["job_id"], letter["seq"], letter["deliveries"]) == (JOB, "10", "2")
    assert pending(redis_client, keys.stream) == 0
    assert published_seqs(subscriber) == []
    repair(redis_client, key)
    assert history_seqs(redis_client, "scan", JOB) == []
    [redriven] = redrive("scan")
    assert redriven.new_id
    Router(burst=True, consumer="r1").run()
    assert_delivered_once(redis_client, subscriber)
    assert dead_letters(redis_client, "scan") == []


# --- dead_letter.lua ----------------------------------------------------------------------------


def stream_of(keys: JobKeys) -> str:
    return keys.stream


def dead_letters_of(keys: JobKeys) -> str:
    return dead_letter_key("scan", keys.shard)


def poison(client, keys: JobKeys) -> str:
    """An entry the router can never apply (not JSON): it dead-letters it on sight."""
    fields = {"job_id": JOB, "domain": "scan", "stage": "vision", "seq": 10, "prev_seq": 0, "data": "{oops"}
    return client.xadd(keys.stream, fields).decode()


def make_route_fail(client, keys: JobKeys) -> str:
    """A well-formed entry whose route fails (its history key is corrupt): the reclaimer
    dead-letters it past max deliveries."""
    publish_event("scan", JOB, "vision", 10, {"n": 10})
    corrupt(client, keys.history, "string")
    return "route script failed: " + corrupt_message(keys.history, "string", "zset")


# The router dead-letters a malformed entry on sight, the reclaimer one whose route failed past
# max deliveries. (A route-failed entry whose stream is corrupt never gets that far: the
# reclaimer cannot claim it.)
@pytest.mark.parametrize(
    "cause, key_of",
    [
        pytest.param("malformed", stream_of, id="malformed-stream"),
        pytest.param("malformed", dead_letters_of, id="malformed-dead-letters"),
        pytest.param("route-failed", dead_letters_of, id="route-failed-dead-letters"),
    ],
)
def test_dead_letter_with_a_corrupt_key_leaves_the_entry_pending_until_repaired(
    redis_client, caplog, key_of, cause
):
    keys = JobKeys("scan", JOB)
    key = key_of(keys)
    if cause == "malformed":
        poison(redis_client, keys)
        reason = re.escape("data is not JSON")
    else:
        reason = make_route_fail(redis_client, keys)
    router = Router(consumer="r1", burst=True)
    batch = read_first(router, keys)
    dead = dead_letters_of(keys)
    corrupt(redis_client, key, "string")
    streams = {name.encode() for name in (keys.stream, keys.stream + ASIDE)}
    before = {k: v for k, v in snapshot(redis_client).items() if k not in streams}

    with caplog.at_level(logging.ERROR):
        router.settle(batch)
        Reclaimer(burst=True, min_idle_ms=0, max_deliveries=1).run()

    # No dead letter written, and (below) the entry still pending: never acked without its dead
    # letter. (The stream itself changes: the reclaimer's claims count the deliveries.)
    assert {k: v for k, v in snapshot(redis_client).items() if k not in streams} == before
    assert re.search(corrupt_message(key, "string", "stream"), caplog.text)
    repair(redis_client, key)
    assert pending(redis_client, keys.stream) == 1
    Reclaimer(burst=True, min_idle_ms=0, max_deliveries=1).run()
    Reclaimer(burst=True, min_idle_ms=0, max_deliveries=1).run()  # nothing left to dead-letter twice

    [letter] = dead_letters(redis_client, "scan")
    assert re.match(reason, letter["reason"]) and letter["seq"] == "10"
    assert pending(redis_client, keys.stream) == 0
    assert redis_client.xlen(dead) == 1


# --- redrive.lua --------------------------------------------------------------------------------


@pytest.mark.parametrize("key_of", [stream_of, dead_letters_of], ids=["stream", "dead-letters"])
def test_redrive_with_a_corrupt_key_writes_nothing_and_keeps_the_dead_letter(
    redis_client, subscriber, key_of
):
    keys = JobKeys("scan", JOB)
    key = key_of(keys)
    publish_event("scan", JOB, "vision", 10, {"n": 10})
    Router(burst=True, consumer="r1").ensure_groups()
    [(entry_id, fields)] = redis_client.xrange(keys.stream)
    redis_client.xdel(keys.stream, entry_id)  # dead-lettered, say
    dead = dead_letters_of(keys)
    dead_fields = {**fields, b"reason": b"test", b"original_stream_id": entry_id}
    dead_id = redis_client.xadd(dead, dead_fields).decode()
    corrupt(redis_client, key, "string")
    before = snapshot(redis_client)
    call = REDRIVE.call(
        (keys.stream, dead),
        (dead_id, eventbus_settings.STREAM_MAXLEN, *(item for pair in fields.items() for item in pair)),
    )

    [result] = run_pipelined(redis_client, [call])

    assert isinstance(result, CorruptKey)
    assert re.fullmatch(corrupt_message(key, "string", "stream"), str(result))
    assert snapshot(redis_client) == before
    repair(redis_client, key)
    [letter] = redrive("scan")
    assert letter.new_id
    Router(burst=True, consumer="r1").run()
    assert_delivered_once(redis_client, subscriber)
    assert dead_letters(redis_client, "scan") == []
