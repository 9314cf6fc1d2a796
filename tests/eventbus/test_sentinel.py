"""Redis Sentinel (real: 1 master, 1 replica, 3 sentinels): the redis+sentinel:// URL, the bus
publishing and routing across a failover, and a job run by a Celery worker whose broker, cache
and bus all come from one such URL. The gateway hub's side is in tests/gateway/test_sentinel_hub.py."""

import json
from io import StringIO

import pytest
import redis
from django.core.management import call_command
from django_redis.cache import RedisCache
from redis.sentinel import SentinelConnectionPool

from eventbus import publish_event
from eventbus.bus.keys import JobKeys
from eventbus.bus.router import Router
from eventbus.bus.scripts import NotReplicated
from eventbus.models import Job
from eventbus.redis.clients import get_redis, wait_replicas
from eventbus.redis.sentinel import (
    BadSentinelURL,
    SentinelURL,
    celery_broker,
    django_redis_cache,
    parse_sentinel_url,
)
from tests.processes import Worker, run_command, wait_for

from .helpers import expected_events, job_events


@pytest.mark.parametrize(
    "url, parsed",
    [
        ("redis://127.0.0.1:6379/0", None),
        ("redis+sentinel://s1:26379,s2:26380/bus/2", SentinelURL((("s1", 26379), ("s2", 26380)), "bus", 2)),
        ("redis+sentinel://:se%40cret@s1/bus", SentinelURL((("s1", 26379),), "bus", 0, "se@cret")),
    ],
)
def test_the_url_form(url, parsed):
    assert parse_sentinel_url(url) == parsed


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://s1:26379",
        "redis+sentinel:///bus",
        "redis+sentinel://s1:x/bus",
        "redis+sentinel://s1/bus/db",
    ],
)
def test_a_url_that_names_no_master_or_no_sentinel_is_refused_clearly(url):
    with pytest.raises(BadSentinelURL, match="redis\\+sentinel"):
        parse_sentinel_url(url)


def test_celery_and_django_redis_get_the_same_master_in_their_forms(sentinel_group):
    broker, options = celery_broker("redis+sentinel://:pw@s1:1,s2:2/bus/3")
    assert (broker, options) == ("sentinel://:pw@s1:1/3;sentinel://:pw@s2:2/3", {"master_name": "bus"})
    entry = django_redis_cache(sentinel_group.url, key_prefix="t")
    cache = RedisCache(entry["LOCATION"], {"KEY_PREFIX": "t", "OPTIONS": entry["OPTIONS"]})
    cache.set("through-sentinel", {"n": 1})
    with redis.Redis(port=sentinel_group.master_port()) as master:
        # django-redis's key: prefix, version, key; its value JSON, never a pickle to load back.
        assert json.loads(master.get("t:1:through-sentinel")) == {"n": 1}
    assert cache.get("through-sentinel") == {"n": 1}


@pytest.mark.django_db
def test_the_bus_publishes_and_routes_across_a_failover_each_event_once(sentinel_bus):
    publish_event("scan", "f1", "vision", 10, {})
    publish_event("scan", "f1", "rule", 20, {})
    Router(burst=True, consumer="sentinel").run()
    old = sentinel_bus.master_port()
    new = sentinel_bus.failover()
    assert new != old
    # The same clients, unchanged settings: they find the new master through the sentinels.
    publish_event("scan", "f1", "rule", 20, {})  # a retry's copy: still a duplicate there
    publish_event("scan", "f1", "answer", 30, {})
    publish_event("scan", "f1", "done", 51, {"final": True})
    Router(burst=True, consumer="sentinel").run()
    with redis.Redis(port=new) as master:
        assert job_events(master, "scan", "f1") == [
            ("vision", 10),
            ("rule", 20),
            ("answer", 30),
            ("done", 51),
        ]
        assert int(master.get(JobKeys("scan", "f1").applied)) == 51
    assert isinstance(get_redis().connection_pool, SentinelConnectionPool)
    out = StringIO()
    call_command("eventbus_shards", "--domains", "scan", stdout=out)
    assert f"{JobKeys('scan', 'f1').stream:<22}     -  bus (Sentinel)" in out.getvalue()


@pytest.mark.django_db
def test_a_publish_returns_once_the_replica_has_it_or_raises_not_replicated(sentinel_bus, settings):
    """Under Sentinel, publish_event WAITs for the replica: an event a failover could lose is
    never reported published. The retry (a duplicate on the master) waits again."""
    assert wait_replicas() == 1
    publish_event("scan", "w1", "vision", 10, {})
    with redis.Redis(port=sentinel_bus.replica_port()) as replica:
        assert job_events(replica, "scan", "w1") == [("vision", 10)]  # there before it returned
    settings.EVENTBUS = {**settings.EVENTBUS, "WAIT_TIMEOUT_MS": 200}
    sentinel_bus.pause_replica()
    try:
        with pytest.raises(NotReplicated, match="0 of 1 replica"):
            publish_event("scan", "w1", "rule", 20, {})
        with pytest.raises(NotReplicated):
            publish_event("scan", "w1", "rule", 20, {})  # the retry: a duplicate, not yet replicated
    finally:
        sentinel_bus.resume_replica()
    settings.EVENTBUS = {**settings.EVENTBUS, "WAIT_TIMEOUT_MS": 5000}
    assert publish_event("scan", "w1", "rule", 20, {}) is False  # replicated now: the retry returns
    with redis.Redis(port=sentinel_bus.replica_port()) as replica:
        assert job_events(replica, "scan", "w1") == [("vision", 10), ("rule", 20)]


@pytest.mark.django_db
def test_no_wait_on_a_plain_redis_unless_asked(redis_client, settings):
    assert wait_replicas() == 0
    settings.EVENTBUS = {**settings.EVENTBUS, "WAIT_REPLICAS": 1, "WAIT_TIMEOUT_MS": 50}
    with pytest.raises(NotReplicated):  # the suite's Redis has no replica
        publish_event("scan", "w2", "vision", 10, {})


@pytest.mark.django_db(transaction=True)
def test_a_worker_on_one_sentinel_url_runs_a_job_broker_cache_and_bus(sentinel_bus, make_job):
    job = make_job("scan")
    # One URL for the three, as a project sets them (Celery reads CELERY_BROKER_URL from the
    # environment before its settings: it must still get kombu's form).
    urls = dict(REDIS_URL=sentinel_bus.url, CELERY_BROKER_URL=sentinel_bus.url, CACHE_URL=sentinel_bus.url)
    worker = Worker("sentinel-worker", **urls).start()
    try:
        code, log = run_command("sweep_jobs", "--burst", "--older-than", "0", **urls)
        assert code == 0, log
        wait_for(
            lambda: Job.objects.get(pk=job.pk).state == Job.State.COMPLETED,
            timeout=40,
            message=f"the job to complete:\n{worker.log()[-3000:]}",
        )
    finally:
        worker.stop()
        worker.log_path.unlink(missing_ok=True)
    with redis.Redis(port=sentinel_bus.master_port()) as master:
        assert job_events(master, "scan", job.id) == expected_events("scan")
        assert master.llen("celery") == 0  # its broker was there too
