"""The router in this process (burst mode and single steps); tests/eventbus/test_commands.py
runs it as real processes."""

import json

import pytest
from prometheus_client import REGISTRY

from eventbus import publish_event, publish_events
from eventbus.bus.keys import JobKeys, stream_key
from eventbus.bus.router import Router
from eventbus.redis import internals as redis_adapter
from tests.processes import wait_for

from .helpers import (
    Subscriber,
    dead_letters,
    history,
    history_seqs,
    job_ids_on_shard,
    pending,
    state,
)


@pytest.fixture
def subscriber(redis_client):
    subscriber = Subscriber(redis_client)
    yield subscriber
    subscriber.close()


def publish_job(domain, job_id, seqs):
    return publish_events(
        [(domain, job_id, "vision" if seq < 20 else "rule", seq, {"seq": seq}) for seq in seqs]
    )


def test_events_are_applied_in_order_to_history_state_and_channel(redis_client, subscriber):
    publish_job("scan", "job-a", [10, 11, 20])
    publish_job("chat", "job-b", [10])

    Router(burst=True, consumer="r1").run()

    events = history(redis_client, "scan", "job-a")
    assert [e["seq"] for e in events] == [10, 11, 20]
    stream_ids = [entry_id.decode() for entry_id, _ in redis_client.xrange(JobKeys("scan", "job-a").stream)]
    assert events[0] == {
        "type": "event",
        "seq": 10,
        "job_id": "job-a",
        "domain": "scan",
        "stage": "vision",
        "data": {"seq": 10},
        "prev_seq": 0,
        "stream_id": stream_ids[0],
    }
    assert [e["stream_id"] for e in events] == stream_ids
    assert [e["prev_seq"] for e in events] == [0, 10, 11]
    # The publisher's state and the router's history entry are the same JSON, to the byte.
    keys = JobKeys("scan", "job-a")
    assert redis_client.get(keys.state) == redis_client.zrange(keys.history, -1, -1)[0]
    received = subscriber.receive(4)
    assert [e for e in received if e["job_id"] == "job-a"] == events
    assert history_seqs(redis_client, "chat", "job-b") == [10]
    # "seq > N in order", as the gateway backfills
    assert [e["seq"] for e in history(redis_client, "scan", "job-a", after=10)] == [11, 20]
    assert 0 < redis_client.ttl(keys.history) <= 3600
    assert redis_client.exists(keys.router_published(20))
    assert all(pending(redis_client, stream_key(d, s)) == 0 for d in ("scan", "chat") for s in range(4))


def test_the_state_never_moves_backwards(redis_client):
    publish_job("scan", "job-c", [10, 11, 12])  # the publisher already stored 12 as the state
    router = Router(consumer="r1", count=1, burst=True)
    router.ensure_groups()
    router.settle(router.read({JobKeys("scan", "job-c").stream: ">"}, None))
    assert history_seqs(redis_client, "scan", "job-c") == [10]
    assert state(redis_client, "scan", "job-c")["seq"] == 12


def test_an_event_waits_until_its_predecessor_is_applied(redis_client, subscriber):
    """Two routers of one group: the one holding seq 10 is slow; the other gets 11 and 12."""
    publish_job("scan", "job-d", [10, 11, 12])
    key = JobKeys("scan", "job-d").stream
    slow, fast = Router(consumer="slow", count=1), Router(consumer="fast", count=1, block_ms=0)
    slow.ensure_groups()
    held = slow.read({key: ">"}, None)
    assert [d.event.seq for d in held] == [10]

    fast.work_once()
    fast.work_once()
    assert sorted(d.event.seq for d in fast.deferred.values()) == [11, 12]
    assert history_seqs(redis_client, "scan", "job-d") == []
    assert subscriber.drain(quiet=0.1) == []
    assert pending(redis_client, key) == 3

    slow.settle(held)
    # fast cannot see slow's apply: it retries its deferred entries every DEFER_RETRY_MS
    wait_for(
        lambda: fast.work_once() and history_seqs(redis_client, "scan", "job-d") == [10, 11, 12],
        message="the deferred entries applied",
    )
    assert [e["seq"] for e in subscriber.receive(3)] == [10, 11, 12]
    assert fast.deferred == {} and pending(redis_client, key) == 0


def test_a_copy_of_an_applied_entry_is_acked_without_a_second_publish(redis_client, subscriber):
    publish_job("scan", "job-e", [10, 11])
    Router(burst=True, consumer="r1").run()
    shard = str(JobKeys("scan", "job-e").shard)
    before = (
        REGISTRY.get_sample_value(
            "eventbus_duplicates_total", {"domain": "scan", "shard": shard, "layer": "L2"}
        )
        or 0
    )
    key = JobKeys("scan", "job-e").stream
    for _id, fields in redis_client.xrange(key):  # e.g. a redrive of entries already applied
        redis_client.xadd(key, fields)

    Router(burst=True, consumer="r1").run()

    assert history_seqs(redis_client, "scan", "job-e") == [10, 11]
    assert [e["seq"] for e in subscriber.drain()] == [10, 11]
    assert pending(redis_client, key) == 0
    after = REGISTRY.get_sample_value(
        "eventbus_duplicates_total", {"domain": "scan", "shard": shard, "layer": "L2"}
    )
    assert after - before == 2


def test_malformed_entries_go_to_the_dead_letters_while_the_rest_is_applied(redis_client):
    [job, other_shard_job] = job_ids_on_shard("scan", 1, 1, "ok") + job_ids_on_shard("scan", 2, 1, "x")
    key = stream_key("scan", 1)
    good = {"job_id": job, "domain": "scan", "stage": "vision", "data": "{}"}
    publish_event("scan", job, "vision", 10, {})
    poison = [
        ({**good, "seq": 11, "prev_seq": 10, "data": "{not json"}, "data is not JSON"),
        ({"job_id": job, "seq": 11}, "missing field(s): domain, stage, prev_seq, data"),
        ({**good, "seq": "eleven", "prev_seq": 10}, "seq b'eleven' is not a non-negative integer"),
        ({**good, "seq": 11, "prev_seq": 11}, "seq 11 must be above prev_seq 11"),
        # Past int()'s 4,300 digits, and past the JSON parser's recursion: ValueError and
        # RecursionError escaped the parse, not a dead letter.
        ({**good, "seq": "9" * 5000, "prev_seq": 10}, "is not a non-negative integer"),
        ({**good, "seq": 11, "prev_seq": "0" * 5000}, "is not a non-negative integer"),
        ({**good, "seq": 11, "prev_seq": 10, "data": "[" * 100_000 + "]" * 100_000}, "data is not JSON"),
        ({**good, "seq": 2**53 + 1, "prev_seq": 10}, "is not a non-negative integer"),
        (
            {**good, "job_id": other_shard_job, "seq": 10, "prev_seq": 0},
            "belongs to shard 2, found in shard 1",
        ),
        (
            {**good, "domain": "chat", "seq": 11, "prev_seq": 10},
            "domain 'chat' in the stream of domain 'scan'",
        ),
        (
            {
                b"job_id": job.encode(),
                b"domain": b"scan",
                b"stage": b"\xff",
                b"seq": b"11",
                b"prev_seq": b"10",
                b"data": b"{}",
            },
            "not UTF-8",
        ),
    ]
    poison_ids = [redis_client.xadd(key, fields).decode() for fields, _ in poison]
    publish_event("scan", job, "vision", 11, {"after": "poison"})

    Router(burst=True, consumer="r1").run()

    assert history_seqs(redis_client, "scan", job) == [10, 11]
    letters = dead_letters(redis_client, "scan", 1)
    assert [letter["original_stream_id"] for letter in letters] == poison_ids
    for letter, (fields, reason) in zip(letters, poison):
        assert reason in letter["reason"]
        original = {(k.decode() if isinstance(k, bytes) else k) for k in fields}
        assert original <= set(letter)
    assert pending(redis_client, key) == 0


def test_a_restarted_router_settles_the_entries_it_read_before(redis_client):
    publish_job("scan", "job-f", [10, 11])
    key = JobKeys("scan", "job-f").stream
    router = Router(consumer="crashy", burst=True)
    router.ensure_groups()
    router.read({key: ">"}, None)  # read, then "crashed" before settling
    assert pending(redis_client, key) == 2
    redis_client.xadd(key, {"deleted": "soon"})
    [(gone, _)] = redis_client.xrange(key, "-", "+")[-1:]
    router.read({key: ">"}, None)
    redis_client.xdel(key, gone)  # gone from the stream while pending: acked, nothing to apply

    Router(consumer="crashy", burst=True).run()

    assert history_seqs(redis_client, "scan", "job-f") == [10, 11]
    assert pending(redis_client, key) == 0
    assert dead_letters(redis_client, "scan") == []


def test_history_is_capped(redis_client, eventbus_settings_override):
    with eventbus_settings_override(HISTORY_MAXLEN=3):
        publish_job("scan", "job-g", [10, 11, 12, 13, 14])
        Router(burst=True, consumer="r1").run()
    assert history_seqs(redis_client, "scan", "job-g") == [12, 13, 14]


def test_the_event_json_is_the_published_message(redis_client, subscriber):
    publish_event("chat", "job-h", "answer", 30, {"text": 'caf\u00e9 "quoted"', "empty": [], "n": 1.5})
    Router(burst=True, consumer="r1").run()
    [message] = subscriber.receive(1)
    assert message["data"] == {"text": 'caf\u00e9 "quoted"', "empty": [], "n": 1.5}
    assert json.loads(redis_client.get(JobKeys("chat", "job-h").state)) == message


def test_a_stream_key_of_another_type_is_set_aside_and_the_other_streams_keep_flowing(
    redis_client, monkeypatch, caplog
):
    """A corrupt shard stream key used to make the router exit (and a supervisor restart it
    forever) while no shard's events flowed. It is set aside, the others are served, and once
    the key is repaired its stream is served again: all in one router that never stops."""
    import threading

    from eventbus.bus import router as router_module

    monkeypatch.setattr(router_module, "SET_ASIDE_SECONDS", 0.3)
    jobs = {}
    for n in range(64):  # one job on shard 0, one elsewhere
        keys = JobKeys("scan", f"job-{n}")
        jobs.setdefault(keys.shard == 0, f"job-{n}")
    broken, healthy = jobs[True], jobs[False]
    corrupt_key = stream_key("scan", 0)
    redis_client.set(corrupt_key, "not a stream")

    router = Router(consumer="steady", block_ms=50)
    thread = threading.Thread(target=router.run, daemon=True)
    thread.start()
    try:
        publish_job("scan", healthy, [10, 11])
        wait_for(
            lambda: history_seqs(redis_client, "scan", healthy) == [10, 11],
            timeout=10,
            message="the healthy shard's events",
        )
        assert f"the key {corrupt_key} holds a string, not a stream" in caplog.text
        assert thread.is_alive()

        redis_client.delete(corrupt_key)  # repaired
        publish_job("scan", broken, [10, 11])
        wait_for(
            lambda: history_seqs(redis_client, "scan", broken) == [10, 11],
            timeout=10,
            message="the repaired shard's events",
        )
        assert thread.is_alive()
    finally:
        router.request_stop()
        thread.join(10)
    assert not thread.is_alive()


def test_one_call_settles_a_run_of_entries_and_a_corrupt_key_holds_back_only_its_own(redis_client, caplog):
    """route.lua settles a stream's entries in one call and acks them with one XACK; an entry
    whose key is corrupt writes nothing and stays pending, the others of the call are applied."""
    first, broken, last = job_ids_on_shard("scan", 1, 3, "run")
    for job in (first, broken, last):
        publish_job("scan", job, [10, 11])
    redis_client.set(JobKeys("scan", broken).history, "corrupt")
    key = stream_key("scan", 1)
    router = Router(consumer="r1", burst=True)
    router.ensure_groups()
    batch = router.read({key: ">"}, None)
    assert len(batch) == 6
    redis_client.config_resetstat()

    assert router.settle(batch) == {JobKeys("scan", job).applied for job in (first, last)}

    stats = redis_client.info("commandstats")
    assert (stats["cmdstat_evalsha"]["calls"], stats["cmdstat_xack"]["calls"]) == (1, 1)
    assert history_seqs(redis_client, "scan", first) == history_seqs(redis_client, "scan", last) == [10, 11]
    assert redis_client.get(JobKeys("scan", broken).history) == b"corrupt"
    assert f"CORRUPT {JobKeys('scan', broken).history} holds a string, not a zset" in caplog.text
    # broken's 10 failed, its 11 waits for it: both pending, nothing of them written.
    assert pending(redis_client, key) == 2
    assert not redis_client.exists(JobKeys("scan", broken).applied)
    assert sorted(d.routed.seq for d in router.deferred.values()) == [11]


@pytest.mark.skipif(
    not redis_adapter.INTERNALS,
    reason="redis-py's public pipeline sends no read ahead: the router reads on its own",
)
def test_the_next_batch_is_read_while_a_batch_settles_and_settled_before_a_stop(redis_client):
    """Each round trip reads the next batch ahead of the scripts; a router stopped with such a
    batch in hand settles it before it exits, and reads nothing more."""
    [job] = job_ids_on_shard("scan", 2, 1, "ahead")
    publish_job("scan", job, [10, 11, 12, 13, 14, 15])
    key = stream_key("scan", 2)
    router = Router(consumer="r1", count=2, domains=["scan:2"], burst=True)
    router.setup()

    assert router.work_once() == 1
    assert history_seqs(redis_client, "scan", job) == [10, 11]
    assert [d.routed.seq for d in router._ahead or ()] == [12, 13]
    assert pending(redis_client, key) == 2  # read ahead: delivered to r1, not settled yet

    router.request_stop()
    router.run()

    assert history_seqs(redis_client, "scan", job) == [10, 11, 12, 13]
    assert pending(redis_client, key) == 0
    [group] = redis_client.xinfo_groups(key)
    assert group["lag"] == 2  # 14 and 15: never read, for the next router

    Router(consumer="r2", burst=True).run()
    assert history_seqs(redis_client, "scan", job) == [10, 11, 12, 13, 14, 15]


def test_a_failed_unit_leaves_no_read_ahead_error_for_the_next_one(redis_client):
    """A unit that failed after its read ahead failed too (say the scripts' replies were lost
    as well) must not leave that error for the unit after setup() ran again."""
    from redis.exceptions import ResponseError

    [job] = job_ids_on_shard("scan", 3, 1, "stale")
    router = Router(consumer="r1", domains=["scan:3"], burst=True)
    router.setup()
    router._ahead_error = ResponseError("NOGROUP the read ahead of a failed unit")
    router.setup()  # what the loop runs after a failed unit
    publish_job("scan", job, [10])

    assert router.work_once() == 1
    assert history_seqs(redis_client, "scan", job) == [10]
