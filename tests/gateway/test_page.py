"""The page in a real headless Chromium against a live web server, Celery worker and router:
log in, start a job, see the replay, watch the bar follow every event's `progress` to 100 %,
survive the server closing every socket (the web server restarted mid-job), and never show an event
twice. Also: chat's answer streams in chunk by chunk from the page's default payload, and the
login page and the favicon are served and styled like the page."""

import json
from urllib.parse import urljoin

import pytest

from eventbus.testing import events_of
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
