"""The connection each thread keeps for the bus's scripts (eventbus.redis.internals), against
real Redis: given back when its thread ends, reconnected when the server dropped it while idle,
never shared with a forked child. The fast path's only: redis-py's public API holds none."""

import os
import threading

import pytest

from eventbus import publish_event
from eventbus.redis import internals as held
from eventbus.redis.clients import get_redis, reset_redis

from .helpers import job_events

pytestmark = pytest.mark.skipif(not held.INTERNALS, reason="redis-py's public API path holds no connection")


def held_id() -> int:
    """The server's id of this thread's held connection."""
    connection = held.connection_of(get_redis().connection_pool)
    connection.send_command("CLIENT", "ID")
    return connection.read_response()


def test_a_thread_keeps_one_connection_and_gives_it_back_when_it_ends(redis_client):
    pool = get_redis().connection_pool
    publish_event("scan", "h1", "vision", 10, {})
    mine = held.connection_of(pool)
    publish_event("scan", "h1", "rule", 20, {})
    assert held.connection_of(pool) is mine  # the same one, not checked out again

    def publish(seq):
        publish_event("scan", f"h-thread-{seq}", "vision", seq, {})

    for seq in range(10, 60, 10):  # one thread after the other, as a thread per request
        thread = threading.Thread(target=publish, args=(seq,))
        thread.start()
        thread.join()
    # Each thread's connection went back to the pool when it ended; the next took it again.
    assert pool._in_use_connections == {mine}
    assert len(pool._available_connections) == 1
    assert pool._created_connections == 2


def test_a_connection_the_server_dropped_while_idle_is_replaced(redis_client, monkeypatch):
    monkeypatch.setattr(held, "IDLE_CHECK", 0.0)
    publish_event("scan", "h2", "vision", 10, {})
    before = held_id()
    assert redis_client.client_kill_filter(_id=before) == 1
    assert publish_event("scan", "h2", "rule", 20, {}) is True
    assert held_id() != before
    assert job_events(redis_client, "scan", "h2") == [("vision", 10), ("rule", 20)]


def test_a_forked_child_opens_its_own_connection(redis_client):
    publish_event("scan", "h3", "vision", 10, {})
    parent = held_id()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe and its exit status
        try:
            published = publish_event("scan", "h3-child", "vision", 10, {})
            os.write(write_end, str(held_id()).encode())
            os._exit(0 if published else 1)
        except BaseException:
            os._exit(2)
    os.close(write_end)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with os.fdopen(read_end) as pipe:
        assert int(pipe.read()) != parent  # a socket of its own, not the parent's
    assert publish_event("scan", "h3", "rule", 20, {}) is True
    assert held_id() == parent
    assert job_events(redis_client, "scan", "h3-child") == [("vision", 10)]


@pytest.fixture(autouse=True)
def fresh_connection(redis_client):
    """Each test starts with a new bus client and no connection held by this thread."""
    held._local.slot = None
    reset_redis()
    yield
    held._local.slot = None
