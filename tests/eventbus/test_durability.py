"""The start-up check of the bus's Redis: persistence on, nothing evicted (real servers)."""

import logging

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from config.redis_server import RedisServer
from eventbus.redis.durability import check_durability, durability_problems


@pytest.fixture(scope="module")
def servers():
    durable = RedisServer(durable=True).start()
    ephemeral = RedisServer().start()
    evicting = RedisServer(durable=True, args=("--maxmemory-policy", "allkeys-lru")).start()
    snapshots = RedisServer(args=("--save", "3600 1")).start()
    yield {
        name: redis.Redis(port=s.port, decode_responses=True)
        for name, s in (
            ("durable", durable),
            ("ephemeral", ephemeral),
            ("evicting", evicting),
            ("snapshots", snapshots),
        )
    }
    for server in (durable, ephemeral, evicting, snapshots):
        server.stop()


def test_the_run_commands_private_redis_is_durable(servers):
    assert durability_problems(servers["durable"]) == []


@pytest.mark.parametrize(
    "name, words",
    [
        ("ephemeral", "persistence is off"),
        ("evicting", "maxmemory-policy is allkeys-lru"),
        ("snapshots", "only RDB snapshots"),
    ],
)
def test_an_unsafe_server_is_named_for_what_it_risks(servers, name, words):
    assert any(words in problem for problem in durability_problems(servers[name]))


def test_warn_by_default_refuse_or_ignore_by_setting(servers, settings, caplog):
    with caplog.at_level(logging.WARNING):
        assert check_durability(servers["evicting"], process="run_router")
    assert "run_router: REDIS IS NOT SAFE FOR THE EVENT BUS: maxmemory-policy is allkeys-lru" in caplog.text
    settings.EVENTBUS = {"REDIS_DURABILITY": "refuse"}
    with pytest.raises(ImproperlyConfigured, match="not safe for the event bus"):
        check_durability(servers["ephemeral"], process="run_router")
    assert check_durability(servers["durable"], process="run_router") == []
    settings.EVENTBUS = {"REDIS_DURABILITY": "ignore"}
    assert check_durability(servers["ephemeral"], process="run_router") == []


def test_an_unreachable_server_is_not_a_crash_at_start(settings):
    unreachable = redis.Redis(port=1, socket_connect_timeout=0.2)
    settings.EVENTBUS = {"REDIS_DURABILITY": "refuse"}
    assert check_durability(unreachable, process="gateway") == []


@pytest.mark.redis
def test_make_runs_redis_keeps_its_data_across_a_restart(tmp_path):
    server = RedisServer(data_dir=tmp_path, durable=True).start()
    port = server.port
    client = redis.Redis(port=port)
    client.set("kept", "1")
    client.xadd("{scan:0}:events", {"seq": "10"})
    server.stop()  # SIGTERM: the AOF is flushed
    again = RedisServer(data_dir=tmp_path, port=port, durable=True).start()
    try:
        assert client.get("kept") == b"1" and client.xlen("{scan:0}:events") == 1
    finally:
        client.close()
        again.stop()
