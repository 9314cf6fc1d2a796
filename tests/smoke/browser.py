"""The smoke test's browser (tests/smoke/smoke.py): the tutorial's page, open in chromium, shows a
job started elsewhere (by curl) without a reload.

Runs with the repository's interpreter, which has Playwright (the smoke test's virtualenv has
only the wheel), and Debian's chromium; it imports nothing of the toolkit. A line protocol on
stdin/stdout:

    browser.py BASE_URL COOKIE_NAME COOKIE_VALUE
    -> "ready"                     the page is open and has listed the user's jobs
    <- JOB_ID                      a job just started (by the smoke test's curl)
    -> "seen SECONDS" or "missing" its card appeared on the page after SECONDS, or not in 10 s
"""

from __future__ import annotations

import shutil
import sys
import time

ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"]


def main(base: str, cookie_name: str, cookie_value: str) -> int:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=ARGS
        )
        context = browser.new_context()
        context.add_cookies([{"name": cookie_name, "value": cookie_value, "url": base}])
        page = context.new_page()
        page.goto(f"{base}/")
        # The list has loaded once the status line no longer says it is loading.
        page.wait_for_function(
            "() => !document.getElementById('jobs-status').textContent.includes('Loading')", timeout=15000
        )
        print("ready", flush=True)
        job_id = sys.stdin.readline().strip()
        started = time.monotonic()
        try:
            page.wait_for_selector(f"#job-{job_id}", state="attached", timeout=10000)
        except PlaywrightTimeout:
            print("missing", flush=True)
        else:
            print(f"seen {time.monotonic() - started:.1f}", flush=True)
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
