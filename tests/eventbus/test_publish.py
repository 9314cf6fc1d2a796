import json
import subprocess
import sys

import pytest
from prometheus_client import REGISTRY

from eventbus import Event, InvalidEvent, OutOfOrderEvent, publish_event, publish_events
from eventbus.bus.keys import JobKeys
from eventbus.bus.scripts import PUBLISH
from eventbus.redis import internals as redis_adapter
from tests.processes import BASE_DIR


def entries(client, domain, job_id):
    job_id = str(job_id)
    return [
        (entry_id.decode(), {k.decode(): v.decode() for k, v in fields.items()})
        for entry_id, fields in client.xrange(JobKeys(domain, job_id).stream)
        if fields[b"job_id"].decode() == job_id
    ]


def test_publish_twice_adds_one_entry_and_reports_the_duplicate(redis_client):
    assert publish_event("scan", "job-1", "vision", 10, {"progress": 0.5}) is True
    assert publish_event("scan", "job-1", "vision", 10, {"progress": 0.5}) is False

    [(entry_id, fields)] = entries(redis_client, "scan", "job-1")
    assert fields == {
        "job_id": "job-1",
        "domain": "scan",
        "stage": "vision",
        "seq": "10",
        "prev_seq": "0",
        "data": '{"progress":0.5}',
    }
    keys = JobKeys("scan", "job-1")
    assert redis_client.exists(keys.published("vision", 10))
    assert 0 < redis_client.ttl(keys.published("vision", 10)) <= 7200


def test_keys_carry_the_domain_shard_hash_tag(redis_client):
    publish_event("chat", "job-tag", "answer", 30, "hello")
    keys = JobKeys("chat", "job-tag")
    tag = f"{{chat:{keys.shard}}}"
    assert sorted(k.decode() for k in redis_client.keys("*")) == sorted(
        [
            f"{tag}:events",
            f"{tag}:state:job-tag",
            f"{tag}:published-seq:job-tag",
            f"{tag}:published:job-tag:answer:30",
        ]
    )


def test_each_entry_names_its_predecessor_and_the_state_is_the_latest_event(redis_client):
    for seq in (10, 11, 20):
        publish_event("scan", "job-2", "vision" if seq < 20 else "rule", seq, {"seq": seq})

    found = entries(redis_client, "scan", "job-2")
    assert [(f["seq"], f["prev_seq"]) for _, f in found] == [("10", "0"), ("11", "10"), ("20", "11")]
    state = json.loads(redis_client.get(JobKeys("scan", "job-2").state))
    assert state == {
        "type": "event",
        "seq": 20,
        "job_id": "job-2",
        "domain": "scan",
        "stage": "rule",
        "data": {"seq": 20},
        "prev_seq": 11,
        "stream_id": found[-1][0],
    }
    assert 0 < redis_client.ttl(JobKeys("scan", "job-2").state) <= 3600


def test_a_new_event_not_above_the_last_seq_is_refused(redis_client):
    publish_event("scan", "job-3", "rule", 21, {})
    with pytest.raises(OutOfOrderEvent) as refused:
        publish_event("scan", "job-3", "vision", 12, {})
    assert refused.value.last_seq == 21
    assert "last published seq is 21" in str(refused.value)
    # The equal seq of another stage is a new event too: refused, not taken for a duplicate.
    with pytest.raises(OutOfOrderEvent):
        publish_event("scan", "job-3", "answer", 21, {})
    assert len(entries(redis_client, "scan", "job-3")) == 1
    # The duplicate of the last one is still just a duplicate.
    assert publish_event("scan", "job-3", "rule", 21, {}) is False


def test_a_batch_is_one_pipeline_with_duplicates_inside_it(redis_client):
    batch = [
        Event("scan", "job-4", "vision", 10, {"n": 1}),
        ("scan", "job-4", "vision", 10, {"n": 1}),  # the same event twice in one batch
        {"domain": "chat", "job_id": "job-5", "stage": "answer", "seq": 30, "data": "hi"},
        ("scan", "job-4", "vision", 11, None),
        ("chat", "job-5", "answer", 30, "hi"),
    ]
    publish_event("scan", "warm-up", "vision", 10, {})  # the script is loaded
    redis_client.config_resetstat()
    assert publish_events(batch) == [True, False, True, True, False]
    # One EVALSHA per event and nothing else; redis-py's Script objects (the public API path of
    # eventbus.redis.internals) add one SCRIPT EXISTS to the pipeline.
    calls = {name: stats["calls"] for name, stats in redis_client.info("commandstats").items()}
    assert calls["cmdstat_evalsha"] == 5
    scripting = {name: n for name, n in calls.items() if name.startswith("cmdstat_script")}
    assert scripting == ({} if redis_adapter.INTERNALS else {"cmdstat_script|exists": 1})
    assert [f["seq"] for _, f in entries(redis_client, "scan", "job-4")] == ["10", "11"]
    assert [f["seq"] for _, f in entries(redis_client, "chat", "job-5")] == ["30"]
    assert publish_events(batch) == [False] * 5
    assert publish_events([]) == []


def test_an_out_of_order_event_in_a_batch_raises_after_the_others_ran(redis_client):
    with pytest.raises(OutOfOrderEvent) as refused:
        publish_events(
            [
                ("scan", "job-6", "rule", 20, {}),
                ("scan", "job-6", "vision", 10, {}),
                ("scan", "job-7", "vision", 10, {}),
            ]
        )
    assert refused.value.results == [True, None, True]
    assert refused.value.event.seq == 10
    assert len(entries(redis_client, "scan", "job-6")) == 1


CYCLE: dict = {}
CYCLE["self"] = CYCLE
DEEP: list = []
for _ in range(100_000):  # deeper than the interpreter's recursion limit
    DEEP = [DEEP]


@pytest.mark.parametrize(
    "event, message",
    [
        (("nope", "j", "vision", 10, {}), "Unknown domain 'nope'"),
        ((["scan"], "j", "vision", 10, {}), r"Unknown domain \['scan'\]"),
        (("scan", "", "vision", 10, {}), "job_id is empty"),
        (("scan", "j", "", 10, {}), "stage must be a non-empty string"),
        (("scan", "j", "vision", 0, {}), "seq must be an int > 0"),
        (("scan", "j", "vision", "10", {}), "seq must be an int > 0"),
        (("scan", "j", "vision", True, {}), "seq must be an int > 0"),
        (("scan", "j", "vision", 2**53 + 1, {}), "seq must be an int > 0 and <= 2\\*\\*53"),
        (("scan", "j", "vision", 10, {"when": object()}), "not JSON-serialisable"),
        (("scan", "j", "vision", 10, float("nan")), "not JSON-serialisable"),
        (("scan", "j", "vision", 10, CYCLE), "not JSON-serialisable: Circular reference"),
        (("scan", "j", "vision", 10, DEEP), "not JSON-serialisable"),
    ],
)
def test_invalid_events_are_refused_before_anything_is_sent(redis_client, event, message):
    with pytest.raises(InvalidEvent, match=message):
        publish_event(*event)
    with pytest.raises(InvalidEvent, match=message):
        publish_events([("scan", "ok", "vision", 10, {}), event])
    assert redis_client.dbsize() == 0


def test_the_script_is_loaded_again_after_a_script_flush(redis_client):
    redis_client.script_flush()
    assert publish_event("scan", "job-8", "vision", 10, {}) is True
    redis_client.script_flush()
    assert publish_events([("scan", "job-8", "vision", 11, {}), ("scan", "job-8", "vision", 12, {})]) == [
        True,
        True,
    ]
    assert redis_client.script_exists(PUBLISH.sha) == [True]


def test_streams_are_trimmed_approximately(redis_client, eventbus_settings_override):
    with eventbus_settings_override(STREAM_MAXLEN=100, DOMAINS={"scan": 1}):
        publish_events([("scan", f"job-{n}", "vision", 10, {}) for n in range(1000)])
        length = redis_client.xlen(JobKeys("scan", "job-0").stream)
    assert 100 <= length < 1000


def test_metrics_count_published_and_duplicate_events(redis_client):
    shard = str(JobKeys("scan", "job-9").shard)

    def sample(name, **labels):
        return REGISTRY.get_sample_value(name, {"domain": "scan", "shard": shard, **labels}) or 0

    published, duplicates = (
        sample("eventbus_published_total"),
        sample("eventbus_duplicates_total", layer="L1"),
    )
    publish_event("scan", "job-9", "vision", 10, {})
    publish_events([("scan", "job-9", "vision", 10, {}), ("scan", "job-9", "vision", 11, {})])
    assert sample("eventbus_published_total") - published == 2
    assert sample("eventbus_duplicates_total", layer="L1") - duplicates == 1


@pytest.mark.processes
def test_importing_the_package_loads_neither_redis_nor_the_publisher():
    code = (
        "import sys, eventbus\n"
        "assert 'eventbus.bus.publish' not in sys.modules and 'redis' not in sys.modules\n"
        "assert callable(eventbus.publish_event) and 'eventbus.bus.publish' in sys.modules\n"
        "print('ok')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        env={"DJANGO_SETTINGS_MODULE": "config.settings.test"},
    )
    assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr


def test_the_web_app_serves_the_bus_metrics(db, client, redis_client):  # the jobs in flight: a query
    publish_event("scan", "job-10", "vision", 10, {})
    body = client.get("/metrics").content.decode()
    for name in (
        "eventbus_published_total",
        "eventbus_duplicates_total",
        "eventbus_applied_total",
        "eventbus_deferred_total",
        "eventbus_dead_letters_total",
        "eventbus_consumer_lag",
        "event_router_reclaim_messages_total",
        "event_router_reclaim_latency_seconds",
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in body, name
