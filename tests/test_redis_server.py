"""The private redis-server that `make run` and the suite start (config.redis_server): its port
is its own, or it says so."""

import pytest

from config.redis_server import RedisServer, free_port


def test_free_ports_are_never_handed_out_twice():
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)


def test_a_server_whose_port_another_one_holds_does_not_pass_for_started():
    """The other server answers on the port; start() waits for its own process, which exits."""
    holder = RedisServer().start()
    try:
        with pytest.raises(RuntimeError, match=f"redis-server did not start on port {holder.port}"):
            RedisServer(port=holder.port).start(timeout=5)
    finally:
        holder.stop()
