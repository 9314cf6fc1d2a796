"""The metrics are not public by default (docs/reference/metrics.md): /metrics answers this machine, or a bearer
token (METRICS_TOKEN); the commands' --metrics-port listens on 127.0.0.1 unless --metrics-addr
says otherwise."""

import socket
import urllib.request

import pytest

from config.redis_server import free_port
from eventbus import metrics
from tests.processes import Manage, wait_for

PROBLEM = "application/problem+json"


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"])
def test_a_client_on_this_machine_gets_the_metrics(db, client, settings, address):
    settings.METRICS_TOKEN = None
    response = client.get("/metrics", REMOTE_ADDR=address)
    assert response.status_code == 200
    assert b"eventbus_published_total" in response.content


@pytest.mark.parametrize("address", ["203.0.113.7", "10.0.0.5", "2001:db8::1", ""])
def test_an_anonymous_client_from_elsewhere_is_refused(client, settings, address):
    settings.METRICS_TOKEN = None
    response = client.get("/metrics", REMOTE_ADDR=address)
    assert response.status_code == 403 and response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["status"] == 403 and "METRICS_TOKEN" in body["detail"]
    assert b"eventbus_" not in response.content


@pytest.mark.parametrize("header", ["HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP"])
def test_a_request_through_a_proxy_on_this_machine_is_not_local(client, settings, header):
    """nginx on the same machine connects from 127.0.0.1 for clients anywhere."""
    settings.METRICS_TOKEN = None
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1", **{header: "203.0.113.7"})
    assert response.status_code == 403 and response["Content-Type"] == PROBLEM


def test_with_a_token_set_a_scrape_needs_it_from_anywhere(db, client, settings):
    settings.METRICS_TOKEN = "scrape-s3cret"
    for address in ("203.0.113.7", "127.0.0.1"):
        for authorization in (
            {},
            {"HTTP_AUTHORIZATION": "Bearer wrong"},
            {"HTTP_AUTHORIZATION": "scrape-s3cret"},
        ):
            response = client.get("/metrics", REMOTE_ADDR=address, **authorization)
            assert response.status_code == 401 and response["Content-Type"] == PROBLEM, (
                address,
                authorization,
            )
            assert response["WWW-Authenticate"].startswith("Bearer")
        response = client.get("/metrics", REMOTE_ADDR=address, HTTP_AUTHORIZATION="Bearer scrape-s3cret")
        assert response.status_code == 200 and b"eventbus_published_total" in response.content


def listening_addresses(port: int) -> set[str]:
    """The local addresses a socket listens on at `port`, as the kernel lists them."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as lines:
            next(lines)
            for line in lines:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(
                        socket.inet_ntop(socket.AF_INET if width == 8 else socket.AF_INET6, _raw(address))
                    )
    return found


def _raw(address: str) -> bytes:
    """/proc/net's hex address: 32-bit words in host (little-endian) order."""
    words = [bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, len(address), 8)]
    return b"".join(words)


def test_serve_listens_on_loopback_by_default():
    port = free_port()
    server = metrics.serve(port)
    try:
        assert server.server_address[0] == "127.0.0.1"
        assert listening_addresses(port) == {"127.0.0.1"}
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert b"eventbus_published_total" in text
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("addr, expected", [(None, {"127.0.0.1"}), ("0.0.0.0", {"0.0.0.0"})])
def test_a_commands_metrics_port_listens_where_metrics_addr_says(
    transactional_db, redis_client, addr, expected
):
    port = free_port()
    extra = ("--metrics-addr", addr) if addr else ()
    router = Manage("run_router", "--consumer", "addr", "--metrics-port", str(port), *extra).start()
    try:
        wait_for(lambda: listening_addresses(port) or router.process.poll() is not None, timeout=30)
        assert listening_addresses(port) == expected, router.log()
    finally:
        router.kill()
        router.log_path.unlink(missing_ok=True)
