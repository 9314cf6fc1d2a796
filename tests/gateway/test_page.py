"""The page in a real headless Chromium against a live web server, Celery worker and router:
log in, start a job, see the replay, watch the bar follow every event's `progress` to 100 %,
survive the server closing every socket (the web server restarted mid-job), and never show an event
twice. Also: chat's answer streams in chunk by chunk from the page's default payload, and the
login page and the favicon are served and styled like the page.

Operating jobs from the page: a running job cancelled by its card's button ends CANCELLED; a job
that failed (its outside API down) shows Retry, whose new card says it retries the old one and
completes (the outside API charged once, under the first job's key); a stage waiting for its
retry shows RETRYING and the attempt that waits; a Cancel the server refuses (409) says why on
the card; a reload lists the user's recent jobs (those started by code too) with their states
and resumes a running one from the last seq shown, each event once.

Jobs started or retried elsewhere (by code, through the API) show up on an open page without a
reload, the count line counting the cards; a job retried elsewhere loses its Retry button, also
when the list cannot tell it and a press of Retry meets the server's 409; each stage's text is
a line of its own; a cancelled job's bar is full, in the cancelled colour."""

import base64
import json
import re
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urljoin, urlparse

import pytest
from django.db import connection
from playwright.sync_api import expect

from eventbus.bus.router import Router
from eventbus.testing import events_of
from tests.eventbus.jobtypes import FlakyJob, outside_api_charges, outside_api_down
from tests.processes import Manage, Worker

pytestmark = pytest.mark.django_db(transaction=True)
STAGE_SECONDS = "0.8"  # a scan job (and a chat job) takes ~3.2 s: time to restart the server in the middle

# Installed before the page's own script: for every log line the page adds for an event, what the
# bar showed right after it. A MutationObserver's callback runs after the task that handled the
# WebSocket message (one message, one task), so it sees the bar as that event left it.
RECORD_BARS = """
window.__bars = [];
new MutationObserver((mutations) => {
  for (const mutation of mutations) {
    for (const node of mutation.addedNodes) {
      if (!(node instanceof HTMLLIElement) || !node.dataset.seq) continue;
      const card = node.closest(".job");
      const bar = card.querySelector("progress");
      window.__bars.push({
        seq: Number(node.dataset.seq),
        value: bar.value,
        aria: Number(bar.getAttribute("aria-valuenow")),
        percent: card.querySelector(".percent").textContent,
      });
    }
  }
}).observe(document, { childList: true, subtree: true });
"""

# What tells a card apart at a glance: compared before and after it is marked seen-again.
CARD_LOOK = """card => {
  const style = getComputedStyle(card);
  const note = card.querySelector(".replay-note");
  return JSON.stringify([style.borderColor, style.boxShadow, style.outlineStyle,
                         note ? getComputedStyle(note).display : null]);
}"""


@pytest.fixture
def stack(web):
    processes = [
        Worker(EVENTBUS_STAGE_SECONDS=STAGE_SECONDS),
        Manage("run_router", "--consumer", "page-router", "--block-ms", "100"),
    ]
    for process in processes:
        process.start()
    yield web
    for process in processes:
        process.stop()


def seqs_in_log(page):
    return [
        int(s)
        for s in page.locator(".job .log li[data-seq]").evaluate_all("els => els.map(e => e.dataset.seq)")
    ]


def expected_bars(domain, payload):
    """(seq, progress) of every event the job publishes: the pipeline is deterministic."""
    return [(seq, data["progress"]) for _stage, seq, data in events_of(domain, payload)]


def bars_seen(page):
    """(seq, bar) for every event the page logged, after checking the bar's three views agree."""
    records = page.evaluate("window.__bars")
    for record in records:
        assert record["value"] == record["aria"], record
        assert record["percent"] == f"{round(record['value'])} %", record
    return [(record["seq"], record["value"]) for record in records]


def screenshot_path(web, name):
    return str(web.log_path.with_name(f"{web.log_path.stem}-{name}.png"))


@pytest.fixture
def walker(django_user_model):
    # Before the browser: Playwright's sync API runs an event loop, where the ORM may not.
    return django_user_model.objects.create_user("walker", password="walk-the-line-42")


def logged_in_page(browser, web):
    page = browser.new_page()
    page.add_init_script(RECORD_BARS)
    page.goto(f"{web.url}/")
    page.fill("#id_username", "walker")
    page.fill("#id_password", "walk-the-line-42")
    page.click("button[type=submit]")
    page.wait_for_selector("#start-job")
    # The page's scripts have run (they offer each job type's payload): the button alone can be
    # there before them, and a test that reads the payload then reads the markup's "{}".
    page.wait_for_load_state("load")
    return page


def test_start_watch_replay_and_resume(walker, stack, browser):
    page = logged_in_page(browser, stack)

    page.select_option("#domain", "scan")
    payload = json.loads(page.input_value("#payload"))
    page.click("#start-job")
    key = page.locator("#sent-key").inner_text()
    assert len(key) == 36
    page.wait_for_selector(".job .log li[data-seq]")  # the first event arrived live
    card = page.locator(".job")
    before = card.evaluate(CARD_LOOK)
    page.click("#send-again")
    page.wait_for_function("document.getElementById('request-result').textContent.includes('replayed')")
    assert page.locator(".job").count() == 1  # the replay started no second job
    # The replay points at the card it would have started, and that shows.
    page.wait_for_selector(".job.seen-again")
    assert card.evaluate(CARD_LOOK) != before
    assert page.locator(".job .replay-note").is_visible()

    # The server goes away mid-job, closing every socket; the page shows it and resumes.
    stack.stop()
    page.wait_for_selector(".job .connection[data-state=reconnecting]")
    stack.start()
    page.wait_for_function("document.querySelector('.job progress').value === 100", timeout=30_000)
    page.wait_for_selector(".job .connection[data-state=closed]")

    assert seqs_in_log(page) == [10, 20, 30, 40, 51]
    assert page.locator(".job .log li.duplicate").count() == 0
    assert page.locator(".job .percent").inner_text() == "100 %"
    # After each event, live or backfilled after the restart, the bar showed that event's progress.
    assert (
        bars_seen(page)
        == expected_bars("scan", payload)
        == [(10, 20), (20, 40), (30, 60), (40, 80), (51, 100)]
    )
    page.screenshot(path=str(stack.log_path.with_suffix(".png")))


def test_chat_streams_its_answer_chunk_by_chunk_from_the_default_payload(walker, stack, browser):
    page = logged_in_page(browser, stack)

    page.select_option("#domain", "chat")
    # The payload the page offers for chat is one chat reads: its answer is about the prompt.
    payload = json.loads(page.input_value("#payload"))
    prompt = payload.get("prompt")
    assert isinstance(prompt, str) and prompt.strip(), payload
    page.click("#start-job")

    # Mid-answer (about half the chunks in) the bar stands where the last chunk put it.
    page.wait_for_function(
        "(() => { const bar = document.querySelector('.job progress');"
        " return bar !== null && bar.value >= 40 && bar.value < 100; })()",
        timeout=15_000,
    )
    page.screenshot(path=screenshot_path(stack, "chat-mid-job"))
    page.wait_for_function("document.querySelector('.job progress').value === 100", timeout=30_000)
    page.wait_for_selector(".job .connection[data-state=closed]")

    expected = expected_bars("chat", payload)
    chunks = [seq for seq, _ in expected if seq < 51]
    assert len(chunks) >= 5 and chunks == list(range(30, 30 + len(chunks)))
    assert seqs_in_log(page) == [seq for seq, _ in expected]
    assert page.locator(".job .log li.duplicate").count() == 0
    # One step of the bar per chunk, each the chunk's own progress, then 100.
    assert bars_seen(page) == expected
    assert len({progress for _, progress in expected}) == len(expected)
    answer = "".join(data["text"] for _stage, _seq, data in events_of("chat", payload) if "text" in data)
    assert answer.startswith(f"You asked about {' '.join(prompt.split())}")
    assert page.locator(".job .answer").inner_text() == answer


def test_the_login_page_is_styled_like_the_page_and_the_favicon_is_served(web, browser):
    page = browser.new_page()
    failed = []
    page.on(
        "response", lambda response: response.status >= 400 and failed.append((response.status, response.url))
    )
    response = page.goto(f"{web.url}/")
    assert "/accounts/login/" in page.url and response.status == 200

    # The page's stylesheet is linked and loads, and it applies: the login form is a styled card.
    stylesheet = page.get_attribute("link[rel=stylesheet]", "href")
    css = page.request.get(urljoin(page.url, stylesheet))
    assert css.status == 200 and css.headers["content-type"].startswith("text/css")
    assert page.evaluate("[...document.styleSheets].some(sheet => sheet.cssRules.length > 0)")
    assert "system-ui" in page.evaluate("getComputedStyle(document.body).fontFamily")
    assert page.locator(".auth").evaluate("el => getComputedStyle(el).borderStyle") != "none"
    assert page.locator("#id_username").is_visible() and page.locator("button[type=submit]").is_visible()
    page.screenshot(path=screenshot_path(web, "login"))

    # The icons the page links, and the /favicon.ico every browser asks for, are there.
    icons = page.locator("link[rel=icon]").evaluate_all("els => els.map(e => e.href)")
    assert icons
    for icon in icons:
        answer = page.request.get(icon)
        assert answer.status == 200 and answer.headers["content-type"].startswith("image/"), icon
    favicon = page.request.get(f"{web.url}/favicon.ico")
    assert favicon.status == 200 and favicon.headers["content-type"] in (
        "image/x-icon",
        "image/vnd.microsoft.icon",
    )
    assert favicon.body()[:4] == b"\x00\x00\x01\x00"  # an ICO file
    assert failed == []


# -- operating jobs from the page ---------------------------------------------------------------


def orm(function):
    """Run an ORM call off the test's thread: Playwright's sync API runs an event loop there."""

    def run():
        try:
            return function()
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def start_from_page(page, domain, payload):
    """Start a job with the page's own form; its card (the newest, first) and its id."""
    before = page.locator(".job").count()
    page.select_option("#domain", domain)
    page.fill("#payload", json.dumps(payload))
    page.click("#start-job")
    page.wait_for_function(f"document.querySelectorAll('.job').length > {before}")
    job_id = page.locator(".job").first.get_attribute("data-job-id")
    return card_of(page, job_id), job_id


def card_of(page, job_id):
    return page.locator(f'.job[data-job-id="{job_id}"]')


def wait_for_state(page, job_id, state, timeout=30_000):
    page.wait_for_selector(f'.job[data-job-id="{job_id}"][data-state="{state}"]', timeout=timeout)


def card_seqs(card):
    return [
        int(s) for s in card.locator(".log li[data-seq]").evaluate_all("els => els.map(e => e.dataset.seq)")
    ]


def chip(card, stage):
    return card.locator(f'.stage[data-stage="{stage}"]')


# A chip's text and state follow the job's events and then its detail (attempts, errors), which
# the page asks for after the event that changed the state: the assertions wait for them.
def chip_says(card, stage, text):
    expect(chip(card, stage)).to_have_text(text, timeout=10_000)


def chip_is(card, stage, state):
    expect(chip(card, stage)).to_have_attribute("data-state", state, timeout=10_000)


# The bar's fill once the job ended (app.css: --cancelled, --failed).
CANCELLED_COLOUR = "rgb(179, 179, 179)"
FAILED_COLOUR = "rgb(204, 51, 51)"


def assert_bar_ended(card, outcome, colour):
    """The card's bar is full, marked with the job's outcome, drawn in its colour, and says it."""
    expect(card.locator(".bar")).to_have_class(re.compile(rf"\b{outcome}\b"), timeout=10_000)
    bar = card.locator("progress")
    expect(bar).to_have_js_property("value", 100)
    expect(bar).to_have_attribute("aria-valuetext", outcome)
    assert fill_colour(bar) == colour
    expect(card.locator(".percent")).to_have_text(outcome)


# The colour in the middle of an element as drawn (a bar's fill is a pseudo-element of its
# shadow tree, which getComputedStyle does not reach): its screenshot, read through a canvas.
FILL_COLOUR = """async (png) => {
  const image = new Image();
  image.src = `data:image/png;base64,${png}`;
  await image.decode();
  const canvas = document.createElement("canvas");
  canvas.width = image.width;
  canvas.height = image.height;
  const context = canvas.getContext("2d");
  context.drawImage(image, 0, 0);
  const [r, g, b] = context.getImageData(image.width >> 1, image.height >> 1, 1, 1).data;
  return `rgb(${r}, ${g}, ${b})`;
}"""


def fill_colour(locator):
    return locator.page.evaluate(FILL_COLOUR, base64.b64encode(locator.screenshot()).decode())


def flaky_payload(tmp_path, api, **extra):
    return {"log": str(tmp_path / "flaky.log"), "api": api, **extra}


def test_cancel_a_running_job_from_its_card(walker, stack, browser, tmp_path):
    page = logged_in_page(browser, stack)
    outside_api_down("page-cancel", 0)
    # A wait far longer than the cancel takes to arrive, however late the page sees the stage
    # run on a loaded machine: the cancel always lands mid-stage, which it then stops at once.
    card, job_id = start_from_page(page, "flaky", flaky_payload(tmp_path, "page-cancel", wait=60))
    cancel, retry = card.locator("button.cancel"), card.locator("button.retry")
    assert cancel.is_visible() and not retry.is_visible()  # a live job: Cancel only

    page.wait_for_selector(f'.job[data-job-id="{job_id}"] .stage[data-stage="wait"][data-state="RUNNING"]')
    cancel.click()
    wait_for_state(page, job_id, "CANCELLED")

    assert card.locator(".job-state").inner_text() == "cancelled"
    assert not cancel.is_visible() and retry.is_visible()  # ended: Retry instead
    # The stage the cancel stopped says so; the ones after it never ran.
    page.wait_for_selector(f'.job[data-job-id="{job_id}"] .stage[data-stage="wait"][data-state="CANCELLED"]')
    chip_is(card, "finish", "PENDING")
    chip_says(card, "done", "cancelled")
    # The final event came once; the bar is full, in the cancelled colour, and says "cancelled".
    seqs = card_seqs(card)
    assert seqs[-1] == FlakyJob.final_seq() and len(seqs) == len(set(seqs))
    assert_bar_ended(card, "cancelled", CANCELLED_COLOUR)
    assert "cancelled" in page.locator("#announcer").inner_text()
    assert card.locator(".problem").is_hidden()


def test_a_refused_cancel_shows_its_problem_on_the_card(walker, web, browser, tmp_path):
    """No worker and no router: the job stays PENDING on the page (no event comes, and the page
    asks a pending job nothing more) while it is cancelled behind the card's back, so that the
    card's Cancel meets a job that has ended (409)."""
    page = logged_in_page(browser, web)
    card, job_id = start_from_page(page, "scan", {})
    wait_for_state(page, job_id, "PENDING")
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    behind = page.request.post(f"{web.url}/api/jobs/{job_id}/cancel/", headers={"X-CSRFToken": csrf})
    assert behind.status == 202 and behind.json()["state"] == "CANCELLED"

    card.locator("button.cancel").click()
    problem = card.locator(".problem")
    problem.wait_for(state="visible")
    text = problem.inner_text()
    assert text.startswith("Cancel refused: HTTP 409") and "ended" in text.lower(), text
    # The card then asks how the job ended, and shows it: Retry, not Cancel.
    wait_for_state(page, job_id, "CANCELLED")
    assert card.locator("button.retry").is_visible() and not card.locator("button.cancel").is_visible()


def test_retry_a_failed_job_from_its_card(walker, stack, browser, tmp_path):
    page = logged_in_page(browser, stack)
    outside_api_down("page-retry", 100)  # down for every attempt of the first job
    old_card, old_id = start_from_page(page, "flaky", flaky_payload(tmp_path, "page-retry"))
    wait_for_state(page, old_id, "FAILED")

    retry = old_card.locator("button.retry")
    assert retry.is_visible() and not old_card.locator("button.cancel").is_visible()
    page.wait_for_selector(f'.job[data-job-id="{old_id}"] .stage[data-stage="pay"][data-state="FAILED"]')
    chip_says(old_card, "pay", "pay · failed after 4 attempts")
    chip_is(old_card, "prepare", "COMPLETED")
    note = old_card.locator('.stage-notes li[data-stage="pay"]').inner_text()
    assert note == "pay failed: ConnectionError: page-retry answered 503", note

    outside_api_down("page-retry", 0)  # the API is back
    retry.click()
    page.wait_for_function(f"document.querySelector('.job').dataset.jobId !== '{old_id}'")
    new_id = page.locator(".job").first.get_attribute("data-job-id")
    new_card = card_of(page, new_id)
    key = old_card.locator(".action-key code").inner_text()
    assert len(key) == 36  # the retry's own Idempotency-Key, shown
    assert new_card.locator(".chain .retry-of").inner_text() == f"Retry of {old_id[:8]}"
    assert new_card.locator(".chain .retry-of a").get_attribute("href") == f"#job-{old_id}"
    wait_for_state(page, new_id, "COMPLETED")
    expect(page.locator("#jobs-status")).to_have_text("Newest first: 2 of 2 listed.")  # the cards shown

    assert new_card.locator(".percent").inner_text() == "100 %"
    seqs = card_seqs(new_card)
    assert seqs[-1] == FlakyJob.final_seq() and len(seqs) == len(set(seqs))
    assert new_card.locator(".log li.duplicate").count() == 0
    # The old job keeps its state; its card points at the retry and offers no second one.
    assert old_card.get_attribute("data-state") == "FAILED"
    assert old_card.locator(".chain .retried-as").inner_text() == f"Retried as {new_id[:8]}"
    assert not retry.is_visible()
    # The outside API saw the first job's key again, and charged it once.
    assert outside_api_charges("page-retry") == {f"{old_id}:pay": 1}
    page.screenshot(path="/tmp/page.png", full_page=True)

    # After a reload both are listed; the failed one, not watched now, shows where it stopped
    # (its stages) and its bar ended, full in the failed colour.
    page.reload()
    wait_for_state(page, old_id, "FAILED")
    old_card = card_of(page, old_id)
    page.wait_for_selector(f'.job[data-job-id="{old_id}"] .stage[data-stage="pay"][data-state="FAILED"]')
    assert_bar_ended(old_card, "failed", FAILED_COLOUR)
    assert card_of(page, new_id).locator(".percent").inner_text() == "100 %"
    assert old_card.locator(".chain .retried-as").inner_text() == f"Retried as {new_id[:8]}"
    assert not old_card.locator("button.retry").is_visible()
    page.screenshot(path=screenshot_path(stack, "retried-reloaded"), full_page=True)


def test_a_stage_waiting_for_its_retry_shows_the_attempt_that_waits(walker, stack, browser, tmp_path):
    page = logged_in_page(browser, stack)
    outside_api_down("page-patient", 1)  # one 503: the payment's retry waits its 8 s backoff
    card, job_id = start_from_page(page, "flaky_patient", flaky_payload(tmp_path, "page-patient"))

    # No event tells of a waiting retry: the quiet card asks for the job's stages.
    page.wait_for_selector(f'.job[data-job-id="{job_id}"] .stage[data-stage="pay"][data-state="RETRYING"]')
    chip_says(card, "pay", "pay · retrying: attempt 2")
    note = card.locator('.stage-notes li[data-stage="pay"]').inner_text()
    assert note == "pay (attempt 1 failed, attempt 2 waits): ConnectionError: page-patient answered 503", note
    assert card.get_attribute("data-state") == "RUNNING" and card.locator("button.cancel").is_visible()
    page.screenshot(path=screenshot_path(stack, "retrying"), full_page=True)

    wait_for_state(page, job_id, "COMPLETED", timeout=60_000)
    chip_says(card, "pay", "pay · 2 attempts")
    assert card.locator('.stage-notes li[data-stage="pay"]').count() == 0


def test_a_reload_lists_the_recent_jobs_and_resumes_a_running_one(walker, stack, browser, tmp_path):
    from eventbus import start_job

    by_code, _ = orm(lambda: start_job("scan", {}, key="started-by-code", owner=walker))
    by_code_id = str(by_code.id)
    page = logged_in_page(browser, stack)
    sockets = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    # The job the project's code started is listed, and watched to its end.
    wait_for_state(page, by_code_id, "COMPLETED")

    outside_api_down("page-reload", 0)
    card, job_id = start_from_page(page, "flaky", flaky_payload(tmp_path, "page-reload", wait=4))
    page.wait_for_function(
        f"document.querySelectorAll('.job[data-job-id=\"{job_id}\"] .log li[data-seq]').length >= 8"
    )
    page.reload()
    page.wait_for_selector(f'.job[data-job-id="{job_id}"]')
    resumed_from = [int(parse_qs(urlparse(url).query)["last_seq"][0]) for url in sockets if job_id in url][-1]
    wait_for_state(page, job_id, "COMPLETED")

    # Listed newest first, each with its state; the ended one has no socket and no buttons.
    listed = page.locator(".job").evaluate_all("els => els.map(e => [e.dataset.jobId, e.dataset.state])")
    assert listed == [[job_id, "COMPLETED"], [by_code_id, "COMPLETED"]]
    old = card_of(page, by_code_id)
    assert old.locator(".connection").is_hidden() and old.locator("button.retry").is_hidden()
    assert old.locator(".percent").inner_text() == "100 %"
    assert old.locator(".stage").evaluate_all("els => els.map(e => e.dataset.state)") == ["COMPLETED"] * 5
    # The running job resumed from the last seq shown before the reload: each event once.
    assert resumed_from > 0
    seqs = card_seqs(card)
    assert seqs == sorted(set(seqs)) and seqs[0] > resumed_from and seqs[-1] == FlakyJob.final_seq()
    assert card.locator(".log li.duplicate").count() == 0
    assert card.locator(".log li.resumed").inner_text().startswith(f"resumed after #{resumed_from}")
    assert card.locator(".percent").inner_text() == "100 %"
    # The tab forgets the last seq of a job that ended.
    assert page.evaluate("Object.keys(sessionStorage).filter(k => k.startsWith('jobstream:'))") == []
    page.screenshot(path=screenshot_path(stack, "reloaded"), full_page=True)


def test_older_jobs_come_a_page_at_a_time(walker, web, browser):
    """No worker: eleven jobs started by code stay PENDING; the page lists ten, then the next."""
    from eventbus import start_job

    ids = [
        str(orm(lambda n=n: start_job("scan", {}, key=f"code-{n}", owner=walker))[0].id) for n in range(11)
    ]
    page = logged_in_page(browser, web)
    page.wait_for_function("document.querySelectorAll('.job').length === 10")
    more = page.locator("#more-jobs")
    assert more.is_visible() and page.locator("#jobs-status").inner_text().endswith("10 of 11 listed.")
    # Newest first, each live one with its Cancel button.
    assert page.locator(".job").evaluate_all("els => els.map(e => e.dataset.jobId)") == ids[::-1][:10]
    assert page.locator(".job button.cancel:visible").count() == 10

    more.click()
    page.wait_for_function("document.querySelectorAll('.job').length === 11")
    assert page.locator(".job").last.get_attribute("data-job-id") == ids[0]
    assert more.is_hidden() and page.locator("#jobs-status").inner_text().endswith("11 of 11 listed.")


def test_a_throttled_cancel_shows_its_problem_on_the_card(walker, web, browser):
    """No worker: the job stays PENDING. The user's jobs API budget ("120/min") spent, the
    card's Cancel gets the throttle's 429, and says so with its Retry-After."""
    page = logged_in_page(browser, web)
    card, job_id = start_from_page(page, "scan", {})
    wait_for_state(page, job_id, "PENDING")
    for _ in range(200):
        if page.request.get(f"{web.url}/api/jobs/?page_size=1").status == 429:
            break
    else:
        pytest.fail("the jobs API never throttled")

    card.locator("button.cancel").click()
    problem = card.locator(".problem")
    problem.wait_for(state="visible")
    text = problem.inner_text()
    assert text.startswith("Cancel refused: HTTP 429") and "try again in" in text, text
    assert card.locator("button.cancel").is_enabled()  # pressed again once the wait is over
    assert card.get_attribute("data-state") == "PENDING"
    assert text.removeprefix("Cancel refused: ") in page.locator("#announcer").inner_text()


# -- jobs started and retried elsewhere ---------------------------------------------------------


def route_events(job, events=()):
    """Publish the job's events as a run of it would, then route them (the router's whole work,
    once) to the page's socket. Off the test's thread, as every ORM call here."""
    from eventbus import publish_event

    def run():
        for stage, seq, data in events:
            publish_event(job.domain, str(job.id), stage, seq, data)
        Router(burst=True, consumer="page-test-router").run()

    orm(run)


def api_retry(page, web, job_id, key):
    """POST /api/jobs/<job_id>/retry/ from outside the page's script (the user's session)."""
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    answer = page.request.post(
        f"{web.url}/api/jobs/{job_id}/retry/", headers={"X-CSRFToken": csrf, "Idempotency-Key": key}
    )
    assert answer.status == 201, answer.text()
    return answer.json()["job_id"]


def listed(page):
    return page.locator(".job").evaluate_all("els => els.map(e => e.dataset.jobId)")


def test_jobs_started_and_retried_elsewhere_show_up_without_a_reload(walker, web, browser):
    """No worker: the test plays the job's run (its events, routed as the router does)."""
    from eventbus import cancel_job, start_job

    page = logged_in_page(browser, web)
    status = page.locator("#jobs-status")
    expect(status).to_have_text("No jobs yet: start one above.")
    page.evaluate("window.notReloaded = true")

    # Started by the project's code: its card shows up, and its job is watched live.
    job, _ = orm(lambda: start_job("scan", {}, key="elsewhere", owner=walker))
    job_id = str(job.id)
    card = card_of(page, job_id)
    expect(card).to_have_attribute("data-state", "PENDING", timeout=10_000)
    expect(status).to_have_text("Newest first: 1 of 1 listed.")
    expect(card.locator(".connection")).to_have_attribute("data-state", "live", timeout=10_000)
    # Its chips, read as text (a screen reader, a copy), are words apart.
    assert card.locator(".stages").evaluate("el => el.textContent").split() == [
        "vision",
        "rule",
        "answer",
        "reward",
        "done",
    ]

    # Texts of two stages: a line each, not run together.
    route_events(
        job,
        [
            ("vision", 10, {"progress": 20, "text": "holding for 0 s"}),
            ("rule", 20, {"progress": 40, "text": "calling the bank"}),
        ],
    )
    expect(card.locator(".percent")).to_have_text("40 %", timeout=10_000)
    expect(card.locator(".answer .answer-part")).to_have_text(["holding for 0 s", "calling the bank"])
    assert card.locator(".answer").inner_text() == "holding for 0 s\ncalling the bank"

    # Cancelled: its final event says 100, and the bar is full, in the cancelled colour.
    orm(lambda: cancel_job(job.id))
    route_events(job)
    wait_for_state(page, job_id, "CANCELLED")
    assert_bar_ended(card, "cancelled", CANCELLED_COLOUR)
    retry = card.locator("button.retry")
    expect(retry).to_be_visible()
    for width, name in ((1280, "elsewhere-wide"), (420, "elsewhere-narrow")):
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=screenshot_path(web, name), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})

    # Retried through the API: the retry's card shows up first, and the old card points at it
    # with no Retry button of its own.
    retry_id = api_retry(page, web, job_id, "retried-elsewhere")
    expect(card_of(page, retry_id)).to_have_attribute("data-state", "PENDING", timeout=10_000)
    expect(retry).to_be_hidden()
    expect(card.locator(".chain .retried-as")).to_have_text(f"Retried as {retry_id[:8]}")
    expect(card_of(page, retry_id).locator(".chain .retry-of")).to_have_text(f"Retry of {job_id[:8]}")
    assert listed(page) == [retry_id, job_id]
    expect(status).to_have_text("Newest first: 2 of 2 listed.")

    # The retry, cancelled and retried in turn: its card says both links, apart.
    retry_job = orm(lambda: cancel_job(retry_id))
    route_events(retry_job)
    wait_for_state(page, retry_id, "CANCELLED")
    second_id = api_retry(page, web, retry_id, "retried-again")
    expect(card_of(page, second_id)).to_be_visible(timeout=10_000)
    chain = card_of(page, retry_id).locator(".chain")
    expect(chain).to_have_text(f"Retry of {job_id[:8]} · Retried as {second_id[:8]}")
    assert chain.evaluate("el => el.textContent") == f"Retry of {job_id[:8]} · Retried as {second_id[:8]}"
    assert listed(page) == [second_id, retry_id, job_id]
    expect(status).to_have_text("Newest first: 3 of 3 listed.")
    assert page.evaluate("window.notReloaded") is True
    page.screenshot(path=screenshot_path(web, "elsewhere-chain"), full_page=True)


def test_retry_meets_a_retry_made_elsewhere(walker, web, browser):
    """The page cannot list (its GET /api/jobs/ fails) when the job is retried behind its back:
    its Retry button meets the server's 409, whose `retried_by` the card then shows."""
    from eventbus import cancel_job, start_job

    job, _ = orm(lambda: start_job("scan", {}, key="retried-twice", owner=walker))
    orm(lambda: cancel_job(job.id))
    job_id = str(job.id)
    page = logged_in_page(browser, web)
    card = card_of(page, job_id)
    retry = card.locator("button.retry")
    expect(retry).to_be_visible()

    def no_list(route):
        if route.request.method == "GET":
            route.abort()
        else:
            route.continue_()

    def is_list(url):
        return urlparse(url).path == "/api/jobs/"

    page.route(is_list, no_list)
    retry_id = api_retry(page, web, job_id, "retried-behind")
    retry.click()
    expect(card.locator(".chain .retried-as")).to_have_text(f"Retried as {retry_id[:8]}")
    expect(retry).to_be_hidden()
    expect(card.locator(".problem")).to_be_hidden()
    assert "retried already" in page.locator("#announcer").inner_text()

    # The list answers again: the retry's card comes, and the count counts it.
    page.unroute(is_list, no_list)
    expect(card_of(page, retry_id).locator(".chain .retry-of")).to_have_text(
        f"Retry of {job_id[:8]}", timeout=10_000
    )
    assert listed(page) == [retry_id, job_id]
    expect(page.locator("#jobs-status")).to_have_text("Newest first: 2 of 2 listed.")
