"""The metrics an operator watches, as /metrics serves them in multiprocess mode: the web server
(uvicorn) and a Celery worker (prefork) each write their values to one PROMETHEUS_MULTIPROC_DIR,
and the web's /metrics, scraped from this machine, adds them up; the jobs in flight are read from
the database at the scrape.

One run: a job cancelled before it started (in the web process), a job completed after a retried
stage, a failed job and its retry (which fails too), a long job cancelled midway (by its run, in
the worker). Each family then shows its label values and counts.
"""

import json
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.authtoken.models import Token

from config.redis_server import free_port
from eventbus.models import Job
from tests.processes import Web, Worker, wait_for

from .helpers import job_events
from .jobtypes import outside_api_down
from .test_tasks_worker import VISIBILITY_TIMEOUT, wait_for_state

pytestmark = pytest.mark.django_db(transaction=True)
State = Job.State


def samples(text: str) -> list[tuple[str, dict, float]]:
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def value(text: str, name: str, **labels) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when there is none)."""
    return sum(v for n, found, v in samples(text) if n == name and labels.items() <= found.items())


class Site:
    """The web server, spoken to as a client on this machine does."""

    def __init__(self, web: Web, token: str):
        self.web, self.token = web, token

    def request(self, method: str, path: str, body: dict | None = None, key: str | None = None):
        headers = {"Authorization": f"Token {self.token}", "Content-Type": "application/json"}
        if key:
            headers["Idempotency-Key"] = key
        request = urllib.request.Request(
            f"{self.web.url}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers=headers,
            method=method,
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")

    def post_job(self, domain: str, payload: dict, key: str) -> str:
        status, body = self.request("POST", "/api/jobs/", {"domain": domain, "payload": payload}, key)
        assert status == 201, body
        return body["job_id"]

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.web.url}/metrics", timeout=30) as response:
            return response.read().decode()


def metrics_worker(name: str, directory) -> Worker:
    return Worker(
        name,
        EVENTBUS_STAGE_SECONDS="0.05",
        CELERY_VISIBILITY_TIMEOUT=str(VISIBILITY_TIMEOUT),
        PROMETHEUS_MULTIPROC_DIR=str(directory),
    )


@pytest.fixture
def stack(broker, user, tmp_path):
    """A web server and (once started) a worker, counting into one metrics directory."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    web = Web(free_port(), PROMETHEUS_MULTIPROC_DIR=str(directory)).start()
    worker = metrics_worker("metrics", directory)
    try:
        yield Site(web, Token.objects.create(user=user).key), worker
    finally:
        worker.stop()
        web.stop()
        for process in (worker, web):
            process.log_path.unlink(missing_ok=True)


def test_metrics_show_jobs_stages_running_jobs_and_requests_of_every_process(stack, broker, tmp_path):
    site, worker = stack
    log = str(tmp_path / "log")

    # Cancelled before any worker ran it: the web process ends it.
    pending = site.post_job("scan", {}, key="m-pending")
    assert site.request("POST", f"/api/jobs/{pending}/cancel/")[0] == 202
    text = site.metrics()
    assert value(text, "eventbus_jobs_pending", domain="scan") == 0
    assert value(text, "eventbus_jobs_ended_total", domain="scan", outcome="cancelled") == 1

    worker.start()
    # Completed, its payment stage retried once (the outside API answers 503 once).
    flaky = {"log": log, "api": f"api-{uuid.uuid4().hex[:8]}"}
    outside_api_down(flaky["api"], 1)
    completed = site.post_job("flaky", flaky, key="m-completed")
    # Failed (a stage raised, not retried), then retried: the new job fails the same way.
    failed = site.post_job("staged", {"log": log, "raise": "card declined"}, key="m-failed")
    wait_for_state(completed, State.COMPLETED, [worker.log])
    wait_for_state(failed, State.FAILED, [worker.log])
    status, retried = site.request("POST", f"/api/jobs/{failed}/retry/", key="m-retry")
    assert status == 201, retried
    wait_for_state(retried["job_id"], State.FAILED, [worker.log])

    # Running: the gauge says so while it runs, and drops once it ends (cancelled midway).
    slow = {"log": log, "api": f"api-{uuid.uuid4().hex[:8]}", "wait": 10}
    outside_api_down(slow["api"], 0)
    running = site.post_job("flaky", slow, key="m-running")
    wait_for(
        lambda: ("wait", 32) in job_events(broker, "flaky", running), timeout=30, message="the long stage"
    )
    text = site.metrics()
    assert value(text, "eventbus_jobs_running", domain="flaky") == 1, text
    assert value(text, "eventbus_jobs_running", domain="staged") == 0  # a registered type: 0, not absent
    assert site.request("POST", f"/api/jobs/{running}/cancel/")[0] == 202
    wait_for_state(running, State.CANCELLED, [worker.log])

    text = site.metrics()
    assert value(text, "eventbus_jobs_running") == 0 and value(text, "eventbus_jobs_pending") == 0, text

    ended = {
        ("scan", "cancelled"): 1,
        ("flaky", "completed"): 1,
        ("flaky", "cancelled"): 1,
        ("staged", "failed"): 2,
    }
    for (domain, outcome), count in ended.items():
        assert value(text, "eventbus_jobs_ended_total", domain=domain, outcome=outcome) == count, text
        assert value(text, "eventbus_job_duration_seconds_count", domain=domain, outcome=outcome) == count
    assert value(text, "eventbus_jobs_ended_total") == 5
    # Every job's duration is from its acceptance: the whole job took more than its long stage's
    # first 1.6 s (32 reports of 0.1 s at 0.05 s each: more than 0 in any case).
    assert value(text, "eventbus_job_duration_seconds_sum", domain="flaky", outcome="cancelled") > 0
    assert value(text, "eventbus_jobs_retried_total", domain="staged") == 1
    assert value(text, "eventbus_jobs_retried_total") == 1
    # Started once each by a worker (the pending one never was).
    assert value(text, "eventbus_job_queue_seconds_count", domain="flaky") == 2
    assert value(text, "eventbus_job_queue_seconds_count", domain="staged") == 2
    assert value(text, "eventbus_job_queue_seconds_count", domain="scan") == 0

    attempts = {
        ("flaky", "prepare", "completed"): 2,
        ("flaky", "pay", "retried"): 1,
        ("flaky", "pay", "completed"): 2,
        ("flaky", "wait", "completed"): 1,
        ("flaky", "wait", "cancelled"): 1,
        ("flaky", "finish", "completed"): 1,
        ("staged", "first", "completed"): 1,  # the retry reused it
        ("staged", "second", "failed"): 2,
    }
    for (domain, stage, outcome), count in attempts.items():
        assert (
            value(text, "eventbus_stage_duration_seconds_count", domain=domain, stage=stage, outcome=outcome)
            == count
        ), (domain, stage, outcome, text)
    assert value(text, "eventbus_stage_duration_seconds_count") == sum(attempts.values())
    assert value(text, "eventbus_stage_retries_total", domain="flaky", stage="pay") == 1
    assert value(text, "eventbus_stage_retries_total") == 1

    # Requests by their URL pattern's name, never their path (a job id would be a new series each).
    assert value(text, "http_requests_total", method="POST", view="job-list", status="2xx") == 4
    assert value(text, "http_request_duration_seconds_count", method="POST", view="job-list") == 4
    assert value(text, "http_requests_total", method="POST", view="job-cancel", status="2xx") == 2
    assert value(text, "http_requests_total", method="POST", view="job-retry", status="2xx") == 1
    assert (
        value(text, "http_requests_total", method="GET", view="metrics", status="2xx") == 2
    )  # this scrape counts once answered
    views = {labels["view"] for name, labels, _ in samples(text) if name == "http_requests_total"}
    assert not any("/" in view or running in view for view in views), views


def test_the_running_jobs_stay_right_when_a_worker_dies_mid_job(stack, broker, tmp_path):
    """A worker SIGKILLed mid-job never takes back a +1 of its own: a gauge the workers moved
    would keep counting the job after another worker finished it (or drop it while it is still
    RUNNING). Read from the database, the count follows the job."""
    site, first = stack
    payload = {"log": str(tmp_path / "log"), "api": f"api-{uuid.uuid4().hex[:8]}", "wait": 3}
    outside_api_down(payload["api"], 0)
    job = site.post_job("flaky", payload, key="m-killed")
    first.start()
    wait_for(lambda: ("wait", 32) in job_events(broker, "flaky", job), timeout=30, message="the long stage")
    first.kill()
    assert value(site.metrics(), "eventbus_jobs_running", domain="flaky") == 1  # RUNNING, no worker

    second = metrics_worker("metrics-2", tmp_path / "metrics")
    try:
        second.start()
        wait_for_state(job, State.COMPLETED, [first.log, second.log], timeout=VISIBILITY_TIMEOUT + 30)
        text = site.metrics()
        assert value(text, "eventbus_jobs_running") == 0, text
        assert value(text, "eventbus_jobs_ended_total", domain="flaky", outcome="completed") == 1
        # The killed attempt was never timed; the second run's was.
        assert value(text, "eventbus_stage_duration_seconds_count", domain="flaky", stage="wait") == 1
    finally:
        second.stop()
        second.log_path.unlink(missing_ok=True)
