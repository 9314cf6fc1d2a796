"""The admin's lists at 1280 px in Debian's chromium: each list's columns fit beside its filters
(none hidden under the filter panel or cut off), and the dead letters' page, with a letter of
one 100,000-character word, is no wider than the window."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from eventbus.bus.keys import dead_letter_key
from eventbus.models import Job, StageRecord
from idempotency.models import IdempotencyRecord
from tests.gateway.conftest import browser  # noqa: F401 - the fixture: Debian's chromium

WIDTH = 1280


@pytest.fixture
def rows(live_server, django_user_model, redis_client):
    """A row of each list per job state, made before the browser starts (Playwright's loop then
    runs in this thread, where Django refuses database calls); the live server's URL."""
    owner = django_user_model.objects.create_superuser("operator-with-a-long-name", password="pw")
    now = timezone.now()
    previous = None
    for n, state in enumerate(Job.State):
        previous = Job.objects.create(
            scope=f"-:{owner.pk}",
            idem_key=f"a-rather-long-idempotency-key-{uuid.uuid4()}",
            owner=owner,
            domain="scan",
            event_type="job.requested",
            state=state,
            accepted_at=now - timedelta(minutes=n),
            completed_at=now if state in Job.FINAL_STATES else None,
            retry_of=previous if state == Job.State.CANCELLED else None,
        )
        StageRecord.objects.create(
            job=previous, stage="vision", attempts=3, error_type="SomeRatherLongExceptionName", failed_at=now
        )
        IdempotencyRecord.objects.create(
            scope=f"-:{owner.pk}",
            key=f"a-rather-long-idempotency-key-{uuid.uuid4()}",
            fingerprint="f" * 64,
            method="POST",
            path="/api/jobs/a-long-path/of-several/segments/",
            state="COMPLETED",
            response_status=201,
            expires_at=now + timedelta(days=1),
        )
    redis_client.xadd(
        dead_letter_key("scan", 0), {"reason": "x" * 100_000, "original_stream_id": "y" * 10_000}
    )
    return live_server.url


@pytest.fixture
def admin_page(rows, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": WIDTH, "height": 800})
    page.goto(f"{rows}/admin/login/")
    page.fill("#id_username", "operator-with-a-long-name")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    yield rows, page
    page.close()


@pytest.mark.parametrize(
    "path", ["/admin/eventbus/job/", "/admin/idempotency/idempotencyrecord/", "/admin/eventbus/stagerecord/"]
)
def test_a_lists_columns_sit_beside_its_filters(admin_page, path):
    url, page = admin_page
    page.goto(url + path)
    box = page.evaluate(
        """() => {
            const results = document.querySelector('#changelist .results');
            const table = document.querySelector('#result_list');
            const filter = document.querySelector('#changelist-filter');
            return {
                rows: table.querySelectorAll('tbody tr').length,
                hidden: results.scrollWidth - results.clientWidth,
                tableRight: table.getBoundingClientRect().right,
                filterLeft: filter.getBoundingClientRect().left,
                page: document.documentElement.scrollWidth,
            };
        }"""
    )
    assert box["rows"] == len(Job.State)
    assert box["hidden"] <= 0, box  # no column past the list's right edge
    assert box["tableRight"] <= box["filterLeft"] and box["page"] <= WIDTH, box


def test_the_dead_letters_page_is_no_wider_than_the_window(admin_page):
    url, page = admin_page
    page.goto(url + "/admin/eventbus/deadletter/")
    assert page.locator("tr.dead-letter").count() == 1
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
