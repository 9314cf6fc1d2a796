"""The job, stage and HTTP metrics in process (real database, real Redis): counted once per change,
on commit; the jobs in flight read from the database at each scrape; stage attempts by outcome,
timeouts included; requests by their URL pattern's name. The worker and multiprocess mode:
test_metrics_worker.py."""

import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from prometheus_client import REGISTRY

from eventbus.job import lifecycle
from eventbus.jobtypes import Stage, registry
from eventbus.models import Job

from .jobtypes import FlakyJob, outside_api_down
from .test_metrics_worker import value
from .test_operating import flaky_payload, run_to_end

pytestmark = pytest.mark.django_db(transaction=True)
State = Job.State


def sample(name: str, **labels) -> float:
    """This process's value (the tests run outside multiprocess mode), 0 before any."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Counts:
    """Samples now, and how much each grew since."""

    def __init__(self, *keys: tuple[str, dict]):
        self.keys = keys
        self.before = [sample(name, **labels) for name, labels in keys]

    def grown(self) -> list[float]:
        return [
            sample(name, **labels) - was for (name, labels), was in zip(self.keys, self.before, strict=True)
        ]


def scrape(client) -> str:
    response = client.get("/metrics")  # the test client is on this machine: 127.0.0.1
    assert response.status_code == 200, response.content
    return response.content.decode()


def test_jobs_in_flight_are_read_from_the_database_at_each_scrape(client, make_job, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    scan, chat = make_job("scan"), make_job("chat")
    counts = Counts(
        ("eventbus_jobs_ended_total", {"domain": "scan", "outcome": "completed"}),
        ("eventbus_jobs_ended_total", {"domain": "chat", "outcome": "cancelled"}),
        ("eventbus_job_duration_seconds_count", {"domain": "scan", "outcome": "completed"}),
        ("eventbus_job_queue_seconds_count", {"domain": "scan"}),
        ("eventbus_job_queue_seconds_count", {"domain": "chat"}),
    )
    text = scrape(client)
    assert (value(text, "eventbus_jobs_pending", domain="scan"), value(text, "eventbus_jobs_pending")) == (
        1,
        2,
    )
    assert value(text, "eventbus_jobs_running") == 0
    # Every registered type has its series, at 0 when it has no job in flight.
    for name in registry():
        assert f'eventbus_jobs_running{{domain="{name}"}}' in text, name

    assert lifecycle.start(scan)
    text = scrape(client)
    assert value(text, "eventbus_jobs_running", domain="scan") == 1
    assert value(text, "eventbus_jobs_pending", domain="scan") == 0
    # Its worker may die now: the job stays RUNNING until a run ends it, and so does the gauge.
    assert lifecycle.end(scan, State.COMPLETED) and lifecycle.cancel_pending(chat)
    assert not lifecycle.end(scan, State.FAILED)  # ended already: not counted again
    text = scrape(client)
    assert value(text, "eventbus_jobs_running") == 0 and value(text, "eventbus_jobs_pending") == 0
    assert counts.grown() == [1, 1, 1, 1, 0]  # chat never started


def test_a_change_rolled_back_is_not_counted(make_job):
    job = make_job("scan")
    counts = Counts(
        ("eventbus_jobs_ended_total", {"domain": "scan", "outcome": "completed"}),
        ("eventbus_job_queue_seconds_count", {"domain": "scan"}),
    )
    with pytest.raises(RuntimeError), transaction.atomic():
        assert lifecycle.start(job) and lifecycle.end(job, State.COMPLETED)
        raise RuntimeError("the transaction fails after the change")
    assert Job.objects.get(pk=job.pk).state == State.PENDING
    assert counts.grown() == [0, 0]
    assert lifecycle.start(job) and lifecycle.end(job, State.COMPLETED)  # committed: counted once
    assert counts.grown() == [1, 1]


def test_stage_attempts_are_timed_by_outcome_timeouts_included(redis_client, make_job, tmp_path, monkeypatch):
    stages = list(FlakyJob.stages)
    stages[2] = Stage("wait", "Waiting", width=50, timeout=0.3, retries=1, backoff=0.01)
    monkeypatch.setattr(FlakyJob, "stages", tuple(stages))
    counts = Counts(
        ("eventbus_stage_duration_seconds_count", {"domain": "flaky", "stage": "wait", "outcome": "retried"}),
        (
            "eventbus_stage_duration_seconds_count",
            {"domain": "flaky", "stage": "wait", "outcome": "timed_out"},
        ),
        ("eventbus_stage_retries_total", {"domain": "flaky", "stage": "wait"}),
        (
            "eventbus_stage_duration_seconds_count",
            {"domain": "flaky", "stage": "pay", "outcome": "completed"},
        ),
        ("eventbus_jobs_ended_total", {"domain": "flaky", "outcome": "failed"}),
        ("eventbus_jobs_ended_total", {"domain": "flaky", "outcome": "timed_out"}),
    )
    # Past its Stage.timeout twice: the first attempt is retried, the second fails the job.
    payload = flaky_payload(tmp_path, wait=3)
    outside_api_down(payload["api"], 0)
    assert run_to_end(make_job("flaky", payload).id) == State.FAILED
    assert counts.grown() == [1, 1, 1, 1, 1, 0]
    timed_out = sample(
        "eventbus_stage_duration_seconds_sum", domain="flaky", stage="wait", outcome="timed_out"
    )
    assert timed_out >= 0.3  # it ran past its timeout before it was stopped

    # The job's deadline passes during the stage: the attempt and the job timed out.
    payload = flaky_payload(tmp_path, wait=3)
    outside_api_down(payload["api"], 0)
    job = make_job("flaky", payload, deadline=timezone.now() + timedelta(seconds=0.5))
    monkeypatch.setattr(
        FlakyJob, "stages", FlakyJob.stages[:2] + (Stage("wait", "Waiting", width=50),) + FlakyJob.stages[3:]
    )
    assert run_to_end(job.id) == State.TIMED_OUT
    assert counts.grown() == [1, 2, 1, 2, 1, 1]


def test_http_requests_are_counted_by_their_url_patterns_name_never_their_path(api_client):
    labels = {
        "list": {"method": "POST", "view": "job-list", "status": "2xx"},
        "cancel": {"method": "POST", "view": "job-cancel", "status": "4xx"},
        "other": {"method": "other", "view": "job-list", "status": "4xx"},
        "unmatched": {"method": "GET", "view": "<unmatched>", "status": "4xx"},
    }
    counts = Counts(*(("http_requests_total", found) for found in labels.values()))
    latency = Counts(("http_request_duration_seconds_count", {"method": "POST", "view": "job-cancel"}))
    created = api_client.post(
        "/api/jobs/", {"domain": "scan", "payload": {}}, format="json", HTTP_IDEMPOTENCY_KEY="metrics-1"
    )
    assert created.status_code == 201, created.content
    for _ in range(2):  # two ids, one series
        assert api_client.post(f"/api/jobs/{uuid.uuid4()}/cancel/").status_code == 404
    assert api_client.generic("BREW", "/api/jobs/").status_code == 405  # a method made up: "other"
    assert api_client.get(f"/no/such/page/{uuid.uuid4()}/").status_code == 404
    assert counts.grown() == [1, 2, 1, 1]
    assert latency.grown() == [2]
    views = {
        sample.labels["view"]
        for family in REGISTRY.collect()
        if family.name == "http_requests"
        for sample in family.samples
    }
    assert "job-cancel" in views and not any("/" in view for view in views), views


@pytest.mark.processes
def test_a_scrape_without_the_database_serves_the_other_metrics(db):
    """The database refuses connections (a real one: nothing listens on the port): the jobs in
    flight are left out of that scrape, with a warning, and the rest is served."""
    from config.redis_server import free_port
    from tests.processes import run_command

    code = (
        "from django.test import Client; r = Client().get('/metrics', REMOTE_ADDR='127.0.0.1'); "
        "t = r.content.decode(); "
        "print('status', r.status_code, 'running' in t, 'eventbus_published_total' in t)"
    )
    status, output = run_command(
        "shell",
        "-c",
        code,
        DATABASE_URL=f"postgres://nobody@127.0.0.1:{free_port()}/none",
        TEST_DATABASE_NAME="",
    )
    assert status == 0, output
    assert "status 200 False True" in output, output
    assert "Jobs in flight not measured: the database failed" in output, output
