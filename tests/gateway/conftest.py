import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

from eventbus import publish_event
from eventbus.bus.router import Router
from eventbus.models import Job
from gateway.hub import close_hub
from gateway.sessions import close_session_watch


@pytest.fixture(autouse=True)
def socket_counts_cleared():
    """A socket a test drops without its disconnect (a communicator left open) keeps its place
    under the per-user cap: forgotten after each test, whose users' ids the next may reuse."""
    yield
    from gateway.socketcap import sockets_per_user

    sockets_per_user.clear()


@pytest.fixture
async def hub_closed():
    yield
    await close_hub()
    await close_session_watch()


def login_cookie(user):
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


@pytest.fixture
def cookie(user):
    return login_cookie(user)


@pytest.fixture
def other_cookie(other_user):
    return login_cookie(other_user)


@pytest.fixture
def staff_cookie(django_user_model):
    """Staff with no permission: is_staff alone opens no other user's job."""
    return login_cookie(django_user_model.objects.create_user("ops", password="x", is_staff=True))


@pytest.fixture
def viewer_cookie(django_user_model):
    """A user (not staff) with the job model's view permission: every job is open to them."""
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("auditor", password="x")
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    return login_cookie(viewer)


@pytest.fixture
def job(user, redis_client):
    return Job.objects.create(
        scope="-:1", idem_key="ws-job", domain="scan", event_type="job.requested", owner=user
    )


def make_communicator(path, cookie=None, *, application=None, origin=b"http://testserver"):
    """A socket not connected yet, through config.asgi's application (or `application`)."""
    if application is None:
        from config.asgi import application

    headers = [(b"host", b"testserver")]
    if origin is not None:
        headers.append((b"origin", origin))
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def open_socket(path, cookie=None, *, subscribed_to=None, application=None):
    """A connected socket; with `subscribed_to` (a job), once the hub listens to its channel
    (the consumer accepts first and subscribes after)."""
    communicator = make_communicator(path, cookie, application=application)
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    if subscribed_to is not None:
        await wait_subscribed(subscribed_to)
    return communicator


async def wait_subscribed(job, timeout=5.0):
    from eventbus.bus.keys import JobKeys
    from gateway.hub import get_hub

    channel = JobKeys(job.domain, str(job.id)).channel
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await subscribers(get_hub().redis, channel):
        assert loop.time() < deadline, "the hub never subscribed"
        await asyncio.sleep(0.01)


async def subscribers(client, channel) -> int:
    """Subscribers of a job channel: classic ones, or on a cluster the shard channel's, on its master."""
    from eventbus.redis.clients import is_cluster

    if is_cluster(client):
        await client.initialize()  # its slot map, on first use
        node = client.get_node_from_key(channel)
        return numsub(await client.execute_command("PUBSUB SHARDNUMSUB", channel, target_nodes=node))
    return numsub(await client.pubsub_numsub(channel))


def numsub(reply) -> int:
    """A NUMSUB or SHARDNUMSUB reply for one channel, as redis-py parses it ([(channel, n)]) or not."""
    if reply and isinstance(reply[0], (list, tuple)):
        return sum(int(n) for _, n in reply)
    return int(reply[1]) if reply else 0


def _publish_and_route(job, seqs):
    for seq in seqs:
        stage = {1: "vision", 2: "rule", 3: "answer", 4: "reward", 5: "done"}[seq // 10]
        publish_event(job.domain, str(job.id), stage, seq, {"seq": seq})
    Router(burst=True, consumer="test-router").run()


# One thread of its own: the bus keeps one Redis connection per thread (eventbus.redis.internals
# holds it), so every call reuses the same one. A test that lowers Redis's maxclients to keep the
# hub away relies on it: a call on another pool thread would need a new connection, refused.
_publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-publisher")


async def publish_and_route(job, seqs) -> None:
    await asyncio.get_running_loop().run_in_executor(_publisher, _publish_and_route, job, seqs)


@contextlib.asynccontextmanager
async def uvicorn_server(ws, **options):
    """A real uvicorn server serving config.asgi on a free port, with the WebSocket protocol `ws`
    (a class, or a name of uvicorn's --ws option) and uvicorn.Config's `options` (ws_max_size...)."""
    import uvicorn

    from config.asgi import application
    from config.redis_server import free_port

    config = uvicorn.Config(
        application, host="127.0.0.1", port=free_port(), ws=ws, lifespan="off", log_level="warning", **options
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        yield server
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


def uvicorn_socket(server, path, cookie=None, origin="http://testserver"):
    """A real WebSocket client of `server` (websockets' connect, to use in `async with`)."""
    import inspect

    from websockets.asyncio.client import connect

    # websockets 15+ takes a proxy from the environment unless told not to; 13 and 14 know none.
    no_proxy = {"proxy": None} if "proxy" in inspect.signature(connect).parameters else {}
    return connect(
        f"ws://127.0.0.1:{server.config.port}{path}",
        origin=origin,
        additional_headers={"Cookie": f"sessionid={cookie}"} if cookie else None,
        open_timeout=5,
        **no_proxy,
    )


# For the browser tests (test_page.py, test_jobstream.py): Debian's chromium and a live web server.

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def browser():
    import shutil

    from playwright.sync_api import sync_playwright

    assert shutil.which("chromium"), "Debian's chromium is needed (make test installs it: see Makefile)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium") or CHROMIUM,
            args=["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture
def web(redis_client):
    """The web server on a free port (a test may stop it and start it again on the same port)."""
    from config.redis_server import free_port
    from tests.processes import Web

    web = Web(free_port()).start()
    yield web
    web.stop()
