"""A job has at most one retry (eventbus.services.retry_job, the UNIQUE Job.retry_of): a second
key is refused naming the retry, from code, the jobs API, the admin's action and the retry_jobs
command, and two retries racing under two keys give one job (real threads; the PostgreSQL leg
runs the race on an uncommitted retry). The operator's retries keep their keys in a scope no
user's request can write, so a user's job under the same key blocks none of them."""

import io
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from eventbus.exceptions import JobAlreadyRetried
from eventbus.models import Job
from eventbus.services import OPERATOR_SCOPE, retry_job, retry_key, start_job
from tests.idempotency.test_concurrency import in_threads
from tests.processes import wait_for

from .test_admin import job_action, staff

State = Job.State


def ended(make_job, state=State.FAILED, **fields):
    return make_job(state=state, completed_at=timezone.now(), **fields)


@pytest.fixture
def failed(make_job):
    return ended(make_job)


def retry_by_api(client, job, key):
    return client.post(f"/api/jobs/{job.id}/retry/", HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.django_db(transaction=True)  # on_commit runs: the retries are enqueued
def test_a_second_key_is_refused_naming_the_retry_and_the_first_key_still_replays(
    broker, api_client, failed, user
):
    first = retry_by_api(api_client, failed, "r-1")
    assert first.status_code == 201, first.content
    new_id = first.json()["job_id"]

    second = retry_by_api(api_client, failed, "r-2")
    assert second.status_code == 409 and second["Content-Type"] == "application/problem+json"
    body = second.json()
    assert body["type"] == "urn:problem:job-retried" and body["status"] == 409
    assert body["retried_by"] == new_id and new_id in body["detail"]

    replay = retry_by_api(api_client, failed, "r-1")
    assert replay.status_code == 201 and replay.json()["job_id"] == new_id
    # From code: the same key (the owner's scope, as the API's) is the same job; another, refused.
    assert retry_job(failed.id, key="r-1") == (Job.objects.get(pk=new_id), False)
    with pytest.raises(JobAlreadyRetried) as refused:
        retry_job(failed.id, key="r-3")
    assert str(refused.value.retried_by) == new_id
    assert Job.objects.filter(retry_of=failed).count() == 1

    # The list and the detail say which job retries it (and the retry, none).
    detail = api_client.get(f"/api/jobs/{failed.id}/").json()
    assert (detail["retried_by"], detail["retry_of"]) == (new_id, None)
    items = {item["job_id"]: item for item in api_client.get("/api/jobs/").json()["results"]}
    assert items[str(failed.id)]["retried_by"] == new_id
    assert (items[new_id]["retried_by"], items[new_id]["retry_of"]) == (None, str(failed.id))


@pytest.mark.django_db
def test_the_list_reads_retried_by_without_a_query_per_row(api_client, make_job, django_assert_num_queries):
    olds = [make_job(state=State.FAILED) for _ in range(3)]
    for index, old in enumerate(olds):
        make_job(retry_of=old, idem_key=f"retry-{index}")
    api_client.get("/api/jobs/")  # the user's permissions are read once, then cached
    with django_assert_num_queries(2):  # the page (retried_by in it) and the count
        items = api_client.get("/api/jobs/").json()["results"]
    by_id = {item["job_id"]: item["retried_by"] for item in items}
    assert all(by_id[str(old.id)] is not None for old in olds)


def race(failed, threads):
    """`threads` retries of `failed` at once, each under its own key, through the jobs API."""
    token_user = failed.owner

    def post(i):
        client = APIClient()
        client.force_authenticate(token_user)
        return retry_by_api(client, failed, f"race-{i}")

    responses = in_threads(threads, post)
    created = [r for r in responses if r.status_code == 201]
    refused = [r for r in responses if r.status_code == 409]
    assert len(created) == 1 and len(refused) == threads - 1, [r.status_code for r in responses]
    new_id = created[0].json()["job_id"]
    assert all(r.json()["retried_by"] == new_id for r in refused)
    assert [str(pk) for pk in Job.objects.filter(retry_of=failed).values_list("pk", flat=True)] == [new_id]


@pytest.mark.django_db(transaction=True)
def test_retries_racing_under_many_keys_give_one_job(broker, failed):
    race(failed, 8)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_retries_racing_under_many_keys_give_one_job_on_postgresql(broker, failed):
    race(failed, 8)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_retry_racing_an_uncommitted_retry_waits_for_it_and_is_refused(broker, failed):
    """The second retry passes the check (the first is not committed), then its INSERT waits on
    the UNIQUE retry_of until the first commits: refused, naming the first."""
    inserted, release = threading.Event(), threading.Event()

    def first():
        try:
            with transaction.atomic():
                job, created = retry_job(failed.id, key="first")
                inserted.set()
                assert release.wait(30)
            return job
        finally:
            connection.close()

    def second():
        try:
            assert inserted.wait(30)
            retry_job(failed.id, key="second")
        except JobAlreadyRetried as refused:
            return refused
        finally:
            connection.close()

    def waiting_on_a_lock():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            return cursor.fetchone()[0] == 1

    with ThreadPoolExecutor(2) as pool:
        winner, loser = pool.submit(first), pool.submit(second)
        try:
            wait_for(waiting_on_a_lock, timeout=30, message="the second retry's INSERT waiting")
        finally:
            release.set()
        new, refused = winner.result(), loser.result()
    assert isinstance(refused, JobAlreadyRetried) and refused.retried_by == new.id
    assert list(Job.objects.filter(retry_of=failed).values_list("pk", flat=True)) == [new.id]


# The operator's retries ----------------------------------------------------------------------


def squat(job, user):
    """The owner starts a job of their own under the key the operator's retry of `job` uses."""
    squatter, created = start_job("scan", {}, key=retry_key(job), owner=user)
    assert created
    return squatter


def assert_retried_by_operator(old, user, api_client):
    new = Job.objects.get(retry_of=old)
    assert (new.scope, new.idem_key, new.owner_id) == (OPERATOR_SCOPE, retry_key(old), user.pk)
    listed = [item["job_id"] for item in api_client.get("/api/jobs/").json()["results"]]
    assert str(new.id) in listed  # the owner's job, in their list


@pytest.mark.django_db(transaction=True)
def test_a_users_job_under_the_bulk_key_blocks_neither_the_command_nor_the_admin(
    broker, make_job, user, api_client, django_user_model
):
    by_command, by_admin = ended(make_job), ended(make_job, State.CANCELLED)
    for job in (by_command, by_admin):
        squat(job, user)

    out = io.StringIO()
    call_command("retry_jobs", stdout=out, stderr=out)  # the FAILED jobs
    assert "retried 1 of 1" in out.getvalue(), out.getvalue()
    assert_retried_by_operator(by_command, user, api_client)

    changer = staff(django_user_model, "changer", "view_job", "change_job")
    assert b"Retried 1 job(s)." in job_action(changer, "retry_jobs", by_admin).content
    assert_retried_by_operator(by_admin, user, api_client)


@pytest.mark.django_db(transaction=True)
def test_the_admin_and_the_command_report_a_job_retried_already(
    broker, failed, api_client, django_user_model, monkeypatch
):
    owners = retry_by_api(api_client, failed, "mine")
    assert owners.status_code == 201
    new_id = owners.json()["job_id"]

    changer = staff(django_user_model, "changer", "view_job", "change_job")
    page = job_action(changer, "retry_jobs", failed).content.decode()
    # (The admin capitalises a message's first letter: a job id's, when it starts with one.)
    assert f"{failed.id}: already retried as {new_id}" in page.lower() and "Retried 0 job(s)." in page

    # The command lists the jobs without a retry: one retried after it read the list is reported.
    from eventbus.management.commands import retry_jobs

    monkeypatch.setattr(retry_jobs, "jobs_to_retry", lambda **_: Job.objects.filter(pk=failed.pk))
    out = io.StringIO()
    call_command("retry_jobs", stdout=out)
    assert f"already retried {failed.id}" in out.getvalue() and f"as {new_id}" in out.getvalue()
    assert Job.objects.filter(retry_of=failed).count() == 1
