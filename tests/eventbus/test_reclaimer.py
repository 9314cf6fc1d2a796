import pytest
import redis
from django.core.management import call_command
from prometheus_client import REGISTRY

from eventbus import publish_events
from eventbus.bus.keys import JobKeys, stream_key
from eventbus.bus.reclaimer import Reclaimer, parse_xautoclaim
from eventbus.bus.router import Router

from .helpers import dead_letters, history_seqs, job_ids_on_shard, pending

FIELDS = [
    b"job_id",
    b"j",
    b"domain",
    b"scan",
    b"stage",
    b"vision",
    b"seq",
    b"10",
    b"prev_seq",
    b"0",
    b"data",
    b"{}",
]


def test_parser_reads_the_live_reply_of_this_server(redis_client, redis_url):
    redis_client.xgroup_create("s", "g", id="0", mkstream=True)
    kept = redis_client.xadd("s", {"a": "1"}).decode()
    gone = redis_client.xadd("s", {"b": "2"}).decode()
    redis_client.xreadgroup("g", "c1", {"s": ">"})
    redis_client.xdel("s", gone)
    raw = redis.Redis.from_url(redis_url)
    raw.set_response_callback("XAUTOCLAIM", lambda response, **options: response)

    reply = raw.execute_command("XAUTOCLAIM", "s", "g", "c2", 0, "0-0", "COUNT", 10)
    cursor, entries, deleted, nils = parse_xautoclaim(reply)

    assert cursor == "0-0"
    assert entries == [(kept, {b"a": b"1"})]
    if len(reply) == 3:  # Redis >= 7: the deleted ids come apart, already dropped from the PEL
        assert (deleted, nils) == ([gone], 0)
        assert pending(redis_client, "s", "g") == 1
    else:  # Redis 6.2: the deleted entry is a nil in the entries
        assert (deleted, nils) == ([], 1)
    raw.close()


def test_parser_reads_the_redis_6_2_shape():
    reply = [b"1700000000001-0", [[b"1700000000000-0", FIELDS], None, [b"1700000000000-2", None]]]
    cursor, entries, deleted, nils = parse_xautoclaim(reply)
    assert cursor == "1700000000001-0"
    assert entries == [("1700000000000-0", dict(zip(FIELDS[::2], FIELDS[1::2])))]
    assert (deleted, nils) == ([], 2)


def test_parser_reads_the_redis_7_shape():
    reply = [b"0-0", [[b"5-0", FIELDS]], [b"3-0", b"4-0"]]
    assert parse_xautoclaim(reply) == (
        "0-0",
        [("5-0", dict(zip(FIELDS[::2], FIELDS[1::2])))],
        ["3-0", "4-0"],
        0,
    )
    assert parse_xautoclaim([b"0-0", [], []]) == ("0-0", [], [], 0)


def read_and_abandon(consumer, key):
    """A router that read entries and died before settling them."""
    router = Router(consumer=consumer)
    router.ensure_groups()
    return router.read({key: ">"}, None)


def test_entries_of_a_dead_consumer_are_reclaimed_and_applied(redis_client):
    publish_events([("scan", "job-r", "vision", seq, {}) for seq in (10, 11, 12)])
    keys = JobKeys("scan", "job-r")
    assert len(read_and_abandon("dead", keys.stream)) == 3
    before = (
        REGISTRY.get_sample_value(
            "event_router_reclaim_messages_total", {"domain": "scan", "shard": str(keys.shard)}
        )
        or 0
    )

    Reclaimer(burst=True, min_idle_ms=0, count=2).run()  # two pages: the cursor is followed

    assert history_seqs(redis_client, "scan", "job-r") == [10, 11, 12]
    assert pending(redis_client, keys.stream) == 0
    after = REGISTRY.get_sample_value(
        "event_router_reclaim_messages_total", {"domain": "scan", "shard": str(keys.shard)}
    )
    assert after - before == 3
    assert (
        REGISTRY.get_sample_value(
            "event_router_reclaim_latency_seconds_count", {"domain": "scan", "shard": str(keys.shard)}
        )
        >= 1
    )


def test_entries_not_idle_long_enough_stay_with_their_consumer(redis_client):
    publish_events([("scan", "job-s", "vision", 10, {})])
    key = JobKeys("scan", "job-s").stream
    read_and_abandon("busy", key)
    Reclaimer(burst=True, min_idle_ms=60_000).run()
    assert history_seqs(redis_client, "scan", "job-s") == []
    assert redis_client.xpending_range(key, "router", "-", "+", 10)[0]["consumer"] == b"busy"


def test_a_deferred_entry_is_dead_lettered_past_max_deliveries(redis_client):
    publish_events([("scan", "job-t", "vision", seq, {"seq": seq}) for seq in (10, 11, 12)])
    key = JobKeys("scan", "job-t").stream
    lost = redis_client.xrange(key)[1][0]
    redis_client.xdel(key, lost)  # seq 11 never reaches the router
    Router(burst=True, consumer="r1").run()
    assert history_seqs(redis_client, "scan", "job-t") == [10]

    Reclaimer(burst=True, min_idle_ms=0, max_deliveries=3).run()  # delivery 2 of 3: still waits
    assert pending(redis_client, key) == 1 and dead_letters(redis_client, "scan") == []
    Reclaimer(burst=True, min_idle_ms=0, max_deliveries=3).run()  # 3
    Reclaimer(burst=True, min_idle_ms=0, max_deliveries=3).run()  # 4 > 3: dead letter

    [letter] = dead_letters(redis_client, "scan")
    assert letter["reason"] == "predecessor seq 11 never applied"
    assert (letter["seq"], letter["prev_seq"], letter["deliveries"]) == ("12", "11", "4")
    assert pending(redis_client, key) == 0
    assert history_seqs(redis_client, "scan", "job-t") == [10]


def test_malformed_pending_entries_are_dead_lettered_and_deleted_ones_acked(redis_client):
    key = stream_key("chat", 0)
    redis_client.xgroup_create(key, "router", id="0", mkstream=True)
    bad = redis_client.xadd(key, {"job_id": "x", "seq": "nope"}).decode()
    gone = redis_client.xadd(key, {"job_id": "y"})
    fields = {"domain": "chat", "stage": "answer", "prev_seq": "0"}
    [job] = job_ids_on_shard("chat", 0, 1, "poison")
    # Parsing these raised ValueError and RecursionError, which ended every pass of the reclaimer.
    huge = redis_client.xadd(key, {**fields, "job_id": job, "seq": "1" * 5000, "data": "{}"}).decode()
    deep = redis_client.xadd(key, {**fields, "job_id": job, "seq": "30", "data": "[" * 200_000}).decode()
    read_and_abandon("dead", key)
    redis_client.xdel(key, gone)

    Reclaimer(burst=True, min_idle_ms=0).run()

    letters = dead_letters(redis_client, "chat", 0)
    assert [letter["original_stream_id"] for letter in letters] == [bad, huge, deep]
    assert letters[0]["reason"].startswith("missing field(s)")
    assert "is not a non-negative integer" in letters[1]["reason"]
    assert letters[2]["reason"].startswith("data is not JSON")
    assert pending(redis_client, key) == 0


def test_streams_without_a_group_are_normal(redis_client, caplog):
    Reclaimer(burst=True, min_idle_ms=0).run()  # no stream exists at all: NOGROUP everywhere
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


def test_the_command_runs_one_pass_in_burst_mode(redis_client):
    publish_events([("chat", "job-u", "answer", 30, "a"), ("chat", "job-u", "answer", 31, "b")])
    read_and_abandon("dead", JobKeys("chat", "job-u").stream)
    call_command("run_reclaimer", burst=True, min_idle_ms=0, domains="chat")
    assert history_seqs(redis_client, "chat", "job-u") == [30, 31]


def test_the_command_refuses_unknown_domains():
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="Unknown domain 'nope'"):
        call_command("run_reclaimer", burst=True, domains="nope")
