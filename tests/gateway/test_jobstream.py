"""gateway/static/gateway/jobstream.js, the reusable client of the job stream, in a real headless
Chromium against a live web server, Celery worker and router. The client is loaded alone (from the
static files, on a page without app.js) and driven the way a user's own front end would.

Each test watches what the client hands the app (onEvent, onReset, onError, onStatus) and, with
Playwright, the sockets the browser really opened and the frames they really received."""

import json
import re
from urllib.parse import parse_qs, urlparse

import pytest

from eventbus.bus.keys import JobKeys
from eventbus.testing import events_of
from tests.processes import Manage, Worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
CHAT = {"prompt": "exactly-once delivery"}
SCAN_SEQS = [seq for _stage, seq, _data in events_of("scan", {})]  # [10, 20, 30, 40, 51]
UNKNOWN_JOB = "00000000-0000-0000-0000-000000000000"

# What the tests run in the page: every stream's callbacks recorded, and jobs started through
# the public API as a front end would (session cookie, CSRF token, Idempotency-Key).
HARNESS = """
window.__streams = {};
window.__watch = (name, url, options) => {
  const record = { events: [], resets: [], errors: [], statuses: [], dropped: [] };
  const stream = JobStream.watch(url, Object.assign({
    onEvent(event) { record.events.push(event); },
    onReset(state) { record.resets.push(state); },
    onError(error) { record.errors.push(error); },
    onStatus(status, info) { record.statuses.push({ status, info, t: performance.now() }); },
    onDropped(frame) { record.dropped.push(frame); },
  }, options || {}));
  window.__streams[name] = { record, stream };
};
window.__record = (name) => {
  const { record, stream } = window.__streams[name];
  return Object.assign({ lastSeq: stream.lastSeq, status: stream.status }, record);
};
window.__startJob = async (domain, payload) => {
  const csrf = decodeURIComponent((document.cookie.match(/(?:^|; )csrftoken=([^;]+)/) || [])[1] || "");
  const response = await fetch("/api/jobs/", {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "Idempotency-Key": crypto.randomUUID(), "X-CSRFToken": csrf },
    body: JSON.stringify({ domain, payload }),
  });
  if (response.status !== 201) throw new Error(`POST /api/jobs/: ${response.status} ${await response.text()}`);
  return response.json();
};
"""


def make_stack(web, stage_seconds):
    processes = [
        Worker(EVENTBUS_STAGE_SECONDS=stage_seconds),
        Manage("run_router", "--consumer", "jobstream-router", "--block-ms", "100"),
    ]
    for process in processes:
        process.start()
    return processes


@pytest.fixture
def stack(web):
    processes = make_stack(web, "0.3")  # a scan job takes ~1.2 s
    yield web
    for process in processes:
        process.stop()


@pytest.fixture
def slow_stack(web):
    processes = make_stack(web, "2")  # a scan job takes ~8 s: time for two outages in the middle
    yield web
    for process in processes:
        process.stop()


@pytest.fixture
def walker(django_user_model):
    # Before the browser: Playwright's sync API runs an event loop, where the ORM may not.
    return django_user_model.objects.create_user("walker", password="walk-the-line-42")


class Sockets:
    """Every WebSocket the page opened: its URL, the frames it received, whether it closed."""

    def __init__(self, page):
        self.all = []
        page.on("websocket", self._opened)

    def _opened(self, socket):
        entry = {"socket": socket, "url": socket.url, "frames": []}
        socket.on("framereceived", lambda payload: entry["frames"].append(json.loads(payload)))
        self.all.append(entry)

    def last_seqs(self):
        return [int(parse_qs(urlparse(entry["url"]).query)["last_seq"][0]) for entry in self.all]


def client_page(browser, web, *, log_in=True):
    """A page of the site that loads jobstream.js, and nothing of the job page's own script."""
    context = browser.new_context()
    page = context.new_page()
    if log_in:
        page.goto(f"{web.url}/")
        page.fill("#id_username", "walker")
        page.fill("#id_password", "walk-the-line-42")
        page.click("button[type=submit]")
        page.wait_for_selector("#start-job")
        page.wait_for_load_state("load")  # the scripts come after #start-job in the document
        # The job page loads the client before its own script, which uses it.
        scripts = page.locator("script[src]").evaluate_all("els => els.map(e => e.getAttribute('src'))")
        assert [s.rsplit("/", 1)[-1] for s in scripts] == ["jobstream.js", "app.js"], scripts
        src = scripts[0]
    page.goto(f"{web.url}/accounts/login/")
    if not log_in:
        src = "/static/gateway/jobstream.js"
    page.add_script_tag(url=src)
    assert page.evaluate("typeof JobStream === 'function' && typeof window.showJob === 'undefined'")
    page.add_script_tag(content=HARNESS)
    return page, Sockets(page)


def record(page, name):
    return page.evaluate("name => window.__record(name)", name)


def wait_status(page, name, status, timeout=20_000):
    page.wait_for_function(
        "([name, status]) => window.__streams[name].stream.status === status",
        arg=[name, status],
        timeout=timeout,
    )


def statuses(rec):
    return [entry["status"] for entry in rec["statuses"]]


def scheduled(rec, since=0):
    """The reconnects the client scheduled (status "reconnecting" with a delay), from statuses[since:]."""
    return [(i, entry) for i, entry in enumerate(rec["statuses"]) if i >= since and "delay" in entry["info"]]


def assert_backoff(rec, steps, *, jitter=True):
    """Each scheduled reconnect waits between half and all of 0.5 s doubled per attempt (10 s at
    most), with jitter, and really waits that long before the next socket."""
    delays = []
    for i, entry in steps:
        attempt, delay = entry["info"]["attempt"], entry["info"]["delay"]
        ceiling = min(10_000, 500 * 2 ** (attempt - 1))
        assert ceiling / 2 <= delay <= ceiling, entry
        following = rec["statuses"][i + 1]  # the next connection attempt
        assert following["status"] == "reconnecting" and "delay" not in following["info"], following
        assert following["t"] - entry["t"] >= delay - 25, (entry, following)
        delays.append((attempt, delay))
    assert [attempt for attempt, _ in delays] == list(range(1, len(delays) + 1)), delays
    if jitter:
        assert any(delay != min(10_000, 500 * 2 ** (attempt - 1)) for attempt, delay in delays), (
            f"no jitter: {delays}"
        )


def test_every_event_is_delivered_once_in_order_and_the_client_stops_after_the_final_one(
    walker, stack, browser
):
    page, sockets = client_page(browser, stack)
    job = page.evaluate("payload => window.__startJob('chat', payload)", CHAT)
    page.evaluate("url => window.__watch('chat', url)", job["ws_url"])  # the API's ws:// URL, as is
    wait_status(page, "chat", "closed")

    rec = record(page, "chat")
    expected = [seq for _stage, seq, _data in events_of("chat", CHAT)]
    assert len(expected) >= 6
    assert [event["seq"] for event in rec["events"]] == expected
    assert all(event["job_id"] == job["job_id"] and event["type"] == "event" for event in rec["events"])
    assert rec["events"][-1]["data"]["final"] is True and rec["lastSeq"] == expected[-1]
    assert statuses(rec) == ["connecting", "open", "closed"]
    assert rec["statuses"][-1]["info"] == {"finished": True}
    assert rec["errors"] == rec["resets"] == rec["dropped"] == []
    # It closed its socket itself after the final event (the server would have kept it open),
    # and opened no other.
    wait_for(
        lambda: sockets.all[0]["socket"].is_closed() or page.wait_for_timeout(50),
        timeout=5,
        message="the client to close its socket",
    )
    page.wait_for_timeout(1_000)
    assert len(sockets.all) == 1 and sockets.last_seqs() == [0]


def test_a_client_with_a_last_seq_gets_only_the_later_events(walker, stack, browser):
    page, sockets = client_page(browser, stack)
    job = page.evaluate("() => window.__startJob('scan', {})")
    # A client that had seq 20 comes back once the job got that far (mid-job, or after it).
    page.evaluate("url => window.__watch('full', url)", job["ws_url"])
    page.wait_for_function("window.__record('full').lastSeq >= 20", timeout=20_000)
    page.evaluate("url => window.__watch('later', url, { lastSeq: 20 })", job["ws_url"])
    wait_status(page, "later", "closed")

    rec = record(page, "later")
    assert [event["seq"] for event in rec["events"]] == [seq for seq in SCAN_SEQS if seq > 20] == [30, 40, 51]
    assert rec["dropped"] == [] and rec["lastSeq"] == 51
    # The client asked the server to resume (it did not fetch everything and filter it).
    assert sockets.last_seqs() == [0, 20]
    assert [frame.get("seq") for frame in sockets.all[1]["frames"]] == [30, 40, 51]


def test_a_refused_socket_reports_the_error_and_never_reconnects(walker, web, browser):
    page, sockets = client_page(browser, web)
    page.evaluate(
        f"() => window.__watch('unknown', '/ws/jobs/{UNKNOWN_JOB}/')"
    )  # a path: resolved on the page
    page.evaluate("() => window.__watch('bad', '/ws/jobs/not-a-uuid/')")
    guest, guest_sockets = client_page(browser, web, log_in=False)
    guest.evaluate(f"() => window.__watch('guest', '/ws/jobs/{UNKNOWN_JOB}/')")
    for on_page, name in [(page, "unknown"), (page, "bad"), (guest, "guest")]:
        wait_status(on_page, name, "closed", timeout=10_000)
    page.wait_for_timeout(2_000)  # a reconnect would come within 0.5 s

    for on_page, name, code in [(page, "unknown", 4404), (page, "bad", 4400), (guest, "guest", 4401)]:
        rec = record(on_page, name)
        assert [(error["code"], error["fatal"]) for error in rec["errors"]] == [(code, True)], rec["errors"]
        assert rec["errors"][0]["detail"]
        assert statuses(rec) == ["connecting", "open", "closed"]
        assert rec["statuses"][-1]["info"]["code"] == code
        assert rec["events"] == rec["resets"] == []
    assert len(sockets.all) == 2 and len(guest_sockets.all) == 1


def test_the_client_reconnects_with_backoff_while_the_server_is_away_and_resumes_without_duplicates(
    walker, slow_stack, browser
):
    web = slow_stack
    page, sockets = client_page(browser, web)
    job = page.evaluate("() => window.__startJob('scan', {})")
    page.evaluate("url => window.__watch('job', url)", job["ws_url"])
    # A client that has every event already: the server keeps its socket open, so it lives
    # through both outages and shows the backoff starting over after a successful open.
    page.evaluate("url => window.__watch('idle', url, { lastSeq: 51 })", job["ws_url"])
    page.wait_for_function("window.__record('job').events.length >= 1", timeout=20_000)
    wait_status(page, "idle", "open")

    # Outage 1: the web server stops (every socket closes) and stays away for three reconnects.
    web.stop()
    page.wait_for_function(
        "window.__record('idle').statuses.filter(s => 'delay' in s.info).length >= 3", timeout=15_000
    )
    web.start()
    wait_status(page, "idle", "open", timeout=30_000)
    first_outage = len(record(page, "idle")["statuses"])

    # Outage 2: the first reconnect after an open waits the shortest delay again.
    web.stop()
    page.wait_for_function(
        f"window.__record('idle').statuses.slice({first_outage}).some(s => 'delay' in s.info)", timeout=15_000
    )
    web.start()
    wait_status(page, "job", "closed", timeout=30_000)
    wait_status(page, "idle", "open", timeout=30_000)

    rec = record(page, "job")
    assert [event["seq"] for event in rec["events"]] == SCAN_SEQS
    assert rec["dropped"] == [] and rec["resets"] == [] and rec["errors"] == []
    assert "reconnecting" in statuses(rec) and rec["statuses"][-1]["info"] == {"finished": True}
    # Each reconnect of the job's stream resumed from the last seq it had: the server sent
    # nothing twice, so the client had nothing to drop.
    job_sockets = [entry for entry in sockets.all if "last_seq=51" not in entry["url"]]
    received = [frame["seq"] for entry in job_sockets for frame in entry["frames"]]
    assert received == SCAN_SEQS
    assert len(job_sockets) >= 3

    idle = record(page, "idle")
    assert idle["events"] == idle["dropped"] == idle["errors"] == []
    first = [step for step in scheduled(idle) if step[0] < first_outage]
    second = scheduled(idle, since=first_outage)
    assert len(first) >= 3
    assert_backoff(idle, first)
    assert_backoff(idle, second[:1], jitter=False)  # attempt 1 again: 0.25 to 0.5 s


def test_a_reset_frame_reaches_on_reset_and_moves_last_seq(walker, stack, browser, redis_client):
    page, sockets = client_page(browser, stack)
    job = page.evaluate("() => window.__startJob('scan', {})")
    page.evaluate("url => window.__watch('full', url)", job["ws_url"])
    wait_status(page, "full", "closed")
    wait_for(
        lambda: page.request.get(f"{stack.url}/api/jobs/{job['job_id']}/").json()["state"] == "COMPLETED",
        timeout=10,
        message="the job to complete",
    )
    keys = JobKeys("scan", job["job_id"])

    # The history expired; the job's state (its final event) is still there.
    assert redis_client.delete(keys.history) == 1
    page.evaluate("url => window.__watch('trimmed', url, { lastSeq: 20 })", job["ws_url"])
    wait_status(page, "trimmed", "closed")
    rec = record(page, "trimmed")
    assert rec["events"] == [] and len(rec["resets"]) == 1
    state = rec["resets"][0]
    assert state["seq"] == 51 and state["data"]["final"] is True
    assert rec["lastSeq"] == 51  # moved to the state's seq
    assert rec["statuses"][-1]["info"] == {"finished": True}  # the state is the job's end
    assert [frame["type"] for frame in sockets.all[-1]["frames"]] == ["reset"]

    # Every key of the job expired: the gateway resets the client to the outcome it keeps.
    for key in redis_client.scan_iter(match=f"*{job['job_id']}*"):
        redis_client.delete(key)
    page.evaluate("url => window.__watch('expired', url, { lastSeq: 20 })", job["ws_url"])
    wait_status(page, "expired", "closed")
    rec = record(page, "expired")
    assert rec["events"] == [] and rec["errors"] == []
    assert rec["resets"] == [{"job_id": job["job_id"], "domain": "scan", "state": "COMPLETED", "seq": 20}]
    assert rec["lastSeq"] == 20 and rec["statuses"][-1]["info"] == {"finished": True}
    page.wait_for_timeout(500)
    assert sockets.last_seqs() == [0, 20, 20]


# A faulty network in front of the real gateway (Playwright relays the page's socket to the web server):
# the client's own safety nets, which the gateway itself never makes use of.


def relay(page, on_server_message):
    def route(socket):
        server = socket.connect_to_server()
        server.on_message(lambda message: on_server_message(socket, server, message))

    page.route_web_socket(re.compile(r"/ws/jobs/"), route)


def test_a_repeated_frame_is_dropped_not_delivered_twice(walker, stack, browser):
    page, _sockets = client_page(browser, stack)
    relay(page, lambda socket, server, message: (socket.send(message), socket.send(message)))
    job = page.evaluate("payload => window.__startJob('chat', payload)", CHAT)
    page.evaluate("url => window.__watch('chat', url)", job["ws_url"])
    wait_status(page, "chat", "closed")

    rec = record(page, "chat")
    expected = [seq for _stage, seq, _data in events_of("chat", CHAT)]
    assert [event["seq"] for event in rec["events"]] == expected
    # Each repeat went to onDropped (the final one's too, unless the client had stopped first).
    assert [frame["seq"] for frame in rec["dropped"]] in (expected, expected[:-1])


def test_a_client_closed_4008_resumes_at_once_from_its_last_seq(walker, stack, browser):
    page, sockets = client_page(browser, stack)
    cut = []

    def too_slow_after_the_first_event(socket, server, message):
        frame = json.loads(message)
        socket.send(message)
        if frame.get("type") == "event" and not cut:  # the gateway's words when it closes 4008
            cut.append(frame["seq"])
            socket.send(
                json.dumps({"type": "error", "code": 4008, "detail": "Too slow: reconnect with last_seq."})
            )
            socket.close(code=4008, reason="too slow")
            server.close()

    relay(page, too_slow_after_the_first_event)
    job = page.evaluate("() => window.__startJob('scan', {})")
    page.evaluate("url => window.__watch('job', url)", job["ws_url"])
    wait_status(page, "job", "closed")

    rec = record(page, "job")
    assert cut == [10]
    assert [event["seq"] for event in rec["events"]] == SCAN_SEQS and rec["dropped"] == []
    assert [(error["code"], error["fatal"]) for error in rec["errors"]] == [(4008, False)]
    steps = scheduled(rec)
    assert [(entry["info"]["code"], entry["info"]["delay"]) for _i, entry in steps] == [(4008, 0)]
    assert sockets.last_seqs() == [0, 10]
