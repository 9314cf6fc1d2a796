"""Durable stages on the page, in a real headless Chromium against a live web server: an approval
job started from the page waits for a decision (WAITING, its card says for what and until when,
with a button per signal awaited), its approve button sends the signal, and the job completes,
its ledger line written once; a signal sent behind the card's back makes its button's press a
409, which the card explains; a job waiting for its children and each child link to each other."""

import re

import pytest
from playwright.sync_api import expect

from config.jobs import ApprovalJob
from tests.gateway.test_page import (  # noqa: F401 - stack and walker: the fixtures
    card_of,
    card_seqs,
    chip_is,
    logged_in_page,
    orm,
    stack,
    start_from_page,
    wait_for_state,
    walker,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_approval_from_the_page_alone(walker, stack, browser):  # noqa: F811
    from config.models import LedgerEntry

    page = logged_in_page(browser, stack)
    card, job_id = start_from_page(page, "approval", {"amount": 42})

    # The request stage runs, then the review waits: no worker holds it, the card says so.
    wait_for_state(page, job_id, "WAITING")
    expect(card.locator(".job-state")).to_have_text("waiting")
    chip_is(card, "review", "WAITING")
    expect(card.locator('.stage[data-stage="review"]')).to_have_text("review · waiting for approve or reject")
    wait = card.locator(".wait")
    expect(wait).to_have_text(re.compile(r"^Waiting for approve or reject until .+\.$"))
    buttons = card.locator(".signals button")
    expect(buttons).to_have_text(["approve", "reject"])
    assert (
        buttons.first.get_attribute("aria-label")
        == f"Send the signal approve to the approval job {job_id[:8]}"
    )
    assert card.locator("button.cancel").is_visible()  # a waiting job is live: it may be cancelled
    assert "approval job" in page.locator("#announcer").inner_text()
    page.screenshot(path=str(stack.log_path.with_name(f"{stack.log_path.stem}-waiting.png")), full_page=True)

    card.locator('.signals button[data-signal="approve"]').click()
    wait_for_state(page, job_id, "COMPLETED")
    key = card.locator(".action-key code").inner_text()
    assert len(key) == 36
    assert card.locator(".action-key").inner_text() == f"Signal approve sent with Idempotency-Key: {key}"
    assert buttons.count() == 0 and card.locator(".wait").is_hidden()
    assert card.locator(".problem").is_hidden()
    seqs = card_seqs(card)
    assert seqs == [10, 20, 30, ApprovalJob.final_seq()], seqs
    assert card.locator(".log li.duplicate").count() == 0
    expect(card.locator(".percent")).to_have_text("100 %")
    assert orm(lambda: list(LedgerEntry.objects.filter(job_id=job_id).values_list("amount", flat=True))) == [
        42
    ]


def test_a_signal_sent_elsewhere_makes_the_cards_press_a_409_that_says_why(walker, web, browser):  # noqa: F811
    """No worker: the test runs the job to its wait in process; the page lists it WAITING. The
    signal is then sent through the API behind the card's back, and the card's approve meets it."""
    from eventbus import start_job
    from eventbus.job import runs

    job, _ = orm(lambda: start_job("approval", {"amount": 1}, key="behind", owner=walker))
    job_id = str(job.id)
    assert orm(lambda: runs.run(job_id, fail_on_transient=False)) == "waiting"
    page = logged_in_page(browser, web)
    card = card_of(page, job_id)
    expect(card).to_have_attribute("data-state", "WAITING", timeout=10_000)
    approve = card.locator('.signals button[data-signal="approve"]')
    expect(approve).to_be_visible()

    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    behind = page.request.post(
        f"{web.url}/api/jobs/{job_id}/signals/approve/",
        headers={
            "X-CSRFToken": csrf,
            "Idempotency-Key": "sent-elsewhere",
            "Content-Type": "application/json",
        },
        data="{}",
    )
    assert behind.status == 202, behind.text()

    approve.click()
    problem = card.locator(".problem")
    expect(problem).to_be_visible()
    text = problem.inner_text()
    assert text.startswith("Signal approve refused: HTTP 409 The signal was sent already"), text
    assert (
        text in page.locator("#announcer").inner_text()
        or "refused" in page.locator("#announcer").inner_text()
    )
    assert card.get_attribute("data-state") == "WAITING"  # no worker: it was woken, not run


def test_a_parent_and_its_children_link_to_each_other(walker, web, browser, tmp_path):  # noqa: F811
    """No worker: the test runs a job to the wait for its two children in process."""
    from eventbus import start_job
    from eventbus.job import runs

    payload = {"log": str(tmp_path / "log"), "skip_review": True, "children": 2}
    parent, _ = orm(lambda: start_job("durable", payload, key="parent", owner=walker))
    parent_id = str(parent.id)
    assert orm(lambda: runs.run(parent_id, fail_on_transient=False)) == "waiting"
    page = logged_in_page(browser, web)
    card = card_of(page, parent_id)
    expect(card).to_have_attribute("data-state", "WAITING", timeout=10_000)
    expect(card.locator(".wait")).to_have_text("Waiting for its children.")
    expect(card.locator(".signals")).to_be_hidden()  # it waits for no signal
    family = card.locator(".family")
    expect(family).to_have_text(re.compile(r"^2 children: \w{8} \(pending\), \w{8} \(pending\)$"))
    child_ids = family.locator("a").evaluate_all("links => links.map(a => a.hash.slice(5))")
    assert len(child_ids) == 2
    for child_id in child_ids:
        child = card_of(page, child_id)
        expect(child.locator(".family")).to_have_text(f"Started by {parent_id[:8]}", timeout=10_000)
        assert child.locator(".family a").get_attribute("href") == f"#job-{parent_id}"
