"""What one user may store (eventbus.job.limits, checked by eventbus.services for a new job only): a
payload's size (EVENTBUS["MAX_PAYLOAD_BYTES"]) and the jobs started per period
(EVENTBUS["MAX_JOBS_CREATED_PER_USER"] per EVENTBUS["JOBS_CREATED_PERIOD"]), retries included,
counted from the database so that cancelling jobs does not get around it. A replay of a key
always gets its job."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from eventbus.exceptions import JobCreationLimitReached
from eventbus.jobtypes import InvalidPayload
from eventbus.models import Job
from eventbus.services import cancel_job, retry_job, start_job

pytestmark = pytest.mark.django_db

State = Job.State


@pytest.fixture
def limits(settings):
    def set_limits(**values):
        settings.EVENTBUS = {**settings.EVENTBUS, **values}

    return set_limits


def payload_of(size: int) -> dict:
    """A payload whose compact JSON is `size` bytes (UTF-8: "é" is two)."""
    payload = {"s": ""}
    payload["s"] = "é" * ((size - len(json.dumps(payload, separators=(",", ":")))) // 2)
    assert len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()) == size
    return payload


def test_a_payload_over_the_limit_is_refused_naming_it(limits, user):
    limits(MAX_PAYLOAD_BYTES=100)
    job, created = start_job("scan", payload_of(100), key="at-the-limit", owner=user)
    assert created
    with pytest.raises(InvalidPayload, match="102 bytes of JSON; the limit is 100 bytes"):
        start_job("scan", payload_of(102), key="over", owner=user)
    assert not Job.objects.filter(idem_key="over").exists()
    # A lone surrogate (valid JSON) is counted, not an error of the count.
    with pytest.raises(InvalidPayload, match="the limit is 100 bytes"):
        start_job("scan", {"s": "\ud800" * 40}, key="surrogates", owner=user)

    limits(MAX_PAYLOAD_BYTES=10)  # lowered: a replay still gets its job
    assert start_job("scan", payload_of(100), key="at-the-limit", owner=user) == (job, False)
    limits(MAX_PAYLOAD_BYTES=None)
    assert start_job("scan", payload_of(10_000), key="no-limit", owner=user)[1]


def test_the_default_limit_is_64_kib(user):
    assert start_job("scan", payload_of(64 * 1024), key="64k", owner=user)[1]
    with pytest.raises(InvalidPayload):
        start_job("scan", payload_of(64 * 1024 + 2), key="64k+", owner=user)


def test_cancelling_jobs_does_not_get_around_the_jobs_started_per_period(limits, user, other_user):
    limits(MAX_RUNNING_JOBS_PER_USER=1, MAX_JOBS_CREATED_PER_USER=3, JOBS_CREATED_PERIOD=3600)
    started = []
    for index in range(3):
        job, created = start_job("scan", {}, key=f"k{index}", owner=user)
        assert created
        cancel_job(job.id)  # under the running cap again
        started.append(job)
    with pytest.raises(JobCreationLimitReached) as refused:
        start_job("scan", {}, key="k3", owner=user)
    assert refused.value.status == 429 and 1 <= refused.value.retry_after <= 3600
    assert "at most 3 per 3600 s" in str(refused.value)
    assert start_job("scan", {}, key="k0", owner=user) == (started[0], False)  # a replay answers
    assert start_job("scan", {}, key="k0", owner=other_user)[1]  # another user's count
    # A retry is a job started: refused too.
    with pytest.raises(JobCreationLimitReached):
        retry_job(started[0].id, key="retry")

    # Once the oldest leaves the period, one more goes in; the refusal said when.
    Job.objects.filter(pk=started[0].pk).update(accepted_at=timezone.now() - timedelta(seconds=3500))
    with pytest.raises(JobCreationLimitReached) as refused:
        start_job("scan", {}, key="k3", owner=user)
    assert 1 <= refused.value.retry_after <= 100
    Job.objects.filter(pk=started[0].pk).update(accepted_at=timezone.now() - timedelta(hours=2))
    retry, created = retry_job(started[0].id, key="retry")
    assert created and retry.owner == user
    cancel_job(retry.id)
    with pytest.raises(JobCreationLimitReached):  # the retry counted
        start_job("scan", {}, key="k3", owner=user)


def test_no_cap_and_a_cap_of_none(limits, user):
    limits(MAX_JOBS_CREATED_PER_USER=0)
    with pytest.raises(JobCreationLimitReached):
        start_job("scan", {}, key="none-at-all", owner=user)
    limits(MAX_JOBS_CREATED_PER_USER=None, MAX_RUNNING_JOBS_PER_USER=None)
    for index in range(5):
        assert start_job("scan", {}, key=f"free-{index}", owner=user)[1]
