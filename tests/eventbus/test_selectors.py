"""The bus's reads survive what a foreign writer may leave in a job's keys."""

import asyncio

import pytest
import redis.asyncio

from eventbus.bus.keys import JobKeys
from eventbus.selectors import latest_event, read_backfills


@pytest.mark.parametrize("state", [b"{not json", b"[" * 200_000, b"[1, 2]", b'"text"'])
def test_a_state_that_is_not_a_json_object_is_no_latest_event(redis_client, caplog, state):
    redis_client.set(JobKeys("scan", "job-s").state, state)
    assert latest_event("scan", "job-s") is None
    assert "is not a JSON object" in caplog.text


def test_a_history_entry_nested_too_deep_is_the_jobs_error_not_the_batchs(redis_client, redis_url):
    redis_client.zadd(JobKeys("scan", "job-deep").history, {b"[" * 200_000: 10})
    redis_client.zadd(JobKeys("scan", "job-ok").history, {b'{"seq": 10}': 10})

    async def read():
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            return await read_backfills(client, [("scan", "job-deep", 0), ("scan", "job-ok", 0)])
        finally:
            await client.aclose()

    deep, ok = asyncio.run(read())
    assert isinstance(deep, ValueError)
    assert [parsed for _raw, parsed in ok.entries] == [{"seq": 10}]


@pytest.mark.django_db
def test_one_job_is_seen_by_its_owner_without_reading_permissions_and_by_others_only_with_the_view_permission(
    django_user_model,
):
    from django.contrib.auth.models import AnonymousUser, Permission
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from eventbus.models import Job
    from eventbus.selectors import job_to_stream, visible_job

    owner = django_user_model.objects.create_user("owner")
    other = django_user_model.objects.create_user("other")
    viewer = django_user_model.objects.create_user("viewer")
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    job = Job.objects.create(
        scope="-:1", idem_key="k", owner=owner, domain="scan", event_type="job.requested"
    )
    for read in (visible_job, job_to_stream):
        with CaptureQueriesContext(connection) as queries:
            assert read(owner, job.pk).pk == job.pk
        assert len(queries) == 1, [q["sql"] for q in queries]  # the job's read alone: no permission read
        assert read(other, job.pk) is None
        assert read(AnonymousUser(), job.pk) is None
        assert read(django_user_model.objects.get(pk=viewer.pk), job.pk).pk == job.pk
