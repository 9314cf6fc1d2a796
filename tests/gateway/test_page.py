"""The page in a real headless Chromium against a live daphne, Celery worker and router:
log in, start a job, see the replay, watch the bar reach 100 %, survive the server closing
every socket (daphne restarted mid-job), and never show an event twice."""
import shutil

import pytest

from config.redis_server import free_port
from tests.processes import Daphne, Manage, Worker

pytestmark = pytest.mark.django_db(transaction=True)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
STAGE_SECONDS = "0.8"  # a scan job takes ~4 s: time to restart the server in the middle


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    assert shutil.which("chromium"), "Debian's chromium is needed (make test installs it: see Makefile)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture
def stack(redis_client):
    port = free_port()
    processes = [
        Worker(EVENTBUS_STAGE_SECONDS=STAGE_SECONDS),
        Manage("run_router", "--consumer", "page-router", "--block-ms", "100"),
    ]
    for process in processes:
        process.start()
    web = Daphne(port).start()
    yield web
    web.stop()
    for process in processes:
        process.stop()


def seqs_in_log(page):
    return [int(s) for s in page.locator(".job .log li[data-seq]").evaluate_all("els => els.map(e => e.dataset.seq)")]


@pytest.fixture
def walker(django_user_model):
    # Before the browser: Playwright's sync API runs an event loop, where the ORM may not.
    return django_user_model.objects.create_user("walker", password="walk-the-line-42")


def test_start_watch_replay_and_resume(walker, stack, browser):
    page = browser.new_page()
    page.goto(f"{stack.url}/")
    page.fill("#id_username", "walker")
    page.fill("#id_password", "walk-the-line-42")
    page.click("button[type=submit]")
    page.wait_for_selector("#start-job")

    page.select_option("#domain", "scan")
    page.click("#start-job")
    key = page.locator("#sent-key").inner_text()
    assert len(key) == 36
    page.wait_for_selector(".job .log li[data-seq]")  # the first event arrived live
    page.click("#send-again")
    page.wait_for_function("document.getElementById('request-result').textContent.includes('replayed')")
    assert page.locator(".job").count() == 1  # the replay started no second job

    # The server goes away mid-job, closing every socket; the page shows it and resumes.
    stack.stop()
    page.wait_for_selector(".job .connection[data-state=reconnecting]")
    stack.start()
    page.wait_for_function("document.querySelector('.job progress').value === 100", timeout=30_000)
    page.wait_for_selector(".job .connection[data-state=closed]")

    assert seqs_in_log(page) == [10, 20, 30, 40, 51]
    assert page.locator(".job .log li.duplicate").count() == 0
    assert page.locator(".job .percent").inner_text() == "100 %"
    page.screenshot(path=str(stack.log_path.with_suffix(".png")))
