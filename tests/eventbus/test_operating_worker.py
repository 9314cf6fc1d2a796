"""Operating jobs on a real Celery worker (prefork, Redis broker): a stage's retries against a
flaky outside API, a long stage cancelled midway, a failed job retried once the API recovered.

The outside API is a counter in the bus's Redis (tests.eventbus.jobtypes.call_outside_api),
which the worker's processes and the test both see; its charges are its outside effects, one
per idempotency key.
"""

import json
import uuid

import pytest

from eventbus.bus.keys import JobKeys
from eventbus.models import Job, StageRecord
from eventbus.testing import events_of
from tests.processes import wait_for

from . import test_tasks_worker
from .helpers import job_events
from .jobtypes import FlakyJob, flaky_payload, lines, outside_api_calls, outside_api_charges, outside_api_down
from .test_tasks_worker import post_job, wait_for_state

start_worker = test_tasks_worker.start_worker  # the fixture: workers on the test Redis

pytestmark = pytest.mark.django_db(transaction=True)
State = Job.State


def attempts(job_id) -> dict[str, int]:
    return dict(StageRecord.objects.filter(job_id=job_id).values_list("stage", "attempts"))


def final_events(client, job_id) -> list[dict]:
    job_id = str(job_id)
    return [
        json.loads(fields[b"data"])
        for _id, fields in client.xrange(JobKeys("flaky", job_id).stream)
        if fields[b"job_id"].decode() == job_id and fields[b"stage"] == b"done"
    ]


def assert_one_ordered_stream(client, job_id) -> list[tuple[str, int]]:
    """The job's stream: every seq once, strictly increasing, one final event (the last)."""
    events = job_events(client, "flaky", job_id)
    seqs = [seq for _stage, seq in events]
    assert seqs == sorted(set(seqs)), events
    assert [stage for stage, _seq in events].count("done") == 1 and events[-1][0] == "done", events
    return events


def test_a_flaky_outside_api_is_retried_with_the_same_key_until_it_answers(
    start_worker, broker, api_client, tmp_path
):
    payload = flaky_payload(tmp_path)
    outside_api_down(payload["api"], 2)  # two 503s, then it answers
    job_id = post_job(api_client, "flaky", payload, key="flaky-1").json()["job_id"]
    worker = start_worker()
    wait_for_state(job_id, State.COMPLETED, [worker.log])

    key = f"{job_id}:pay"
    assert attempts(job_id) == {"prepare": 1, "pay": 3, "wait": 1, "finish": 1}
    assert lines(payload["log"]) == [
        "prepare",
        f"pay attempt 1 key {key}",
        f"pay attempt 2 key {key}",
        f"pay attempt 3 key {key}",
        "finish",
    ]
    assert outside_api_calls(payload["api"]) == [key, key, key]
    assert outside_api_charges(payload["api"]) == {key: 1}
    # Each attempt published pay's seq 20 again: the bus kept the first, the watcher saw one.
    events = assert_one_ordered_stream(broker, job_id)
    expected = events_of(FlakyJob, payload, fail={"pay": [ConnectionError, ConnectionError]})
    assert events == [(stage, seq) for stage, seq, _data in expected]
    assert [e["state"] for e in final_events(broker, job_id)] == ["COMPLETED"]
    record = StageRecord.objects.get(job_id=job_id, stage="pay")
    assert (record.state, record.error_type, record.next_attempt_at) == ("COMPLETED", None, None)
    assert worker.received(job_id) == 3  # the first delivery and one countdown per retry


def test_a_stage_failing_past_its_retries_fails_the_job_with_the_last_error(
    start_worker, broker, api_client, tmp_path
):
    payload = flaky_payload(tmp_path)
    outside_api_down(payload["api"], 100)
    job_id = post_job(api_client, "flaky", payload, key="flaky-down").json()["job_id"]
    worker = start_worker()
    wait_for_state(job_id, State.FAILED, [worker.log])

    assert attempts(job_id) == {"prepare": 1, "pay": 4}  # the first attempt and 3 retries
    assert "finish" not in lines(payload["log"])
    error = {"stage": "pay", "type": "ConnectionError", "message": f"{payload['api']} answered 503"}
    assert api_client.get(f"/api/jobs/{job_id}/").json()["error"] == error
    [final] = final_events(broker, job_id)
    assert (final["state"], final["error"]) == ("FAILED", error)
    record = StageRecord.objects.get(job_id=job_id, stage="pay")
    assert (record.state, record.next_attempt_at) == ("FAILED", None)
    assert_one_ordered_stream(broker, job_id)


def test_an_exception_not_in_retry_on_fails_the_job_at_once(start_worker, broker, api_client, tmp_path):
    payload = flaky_payload(tmp_path, refuse=True)
    job_id = post_job(api_client, "flaky", payload, key="flaky-refused").json()["job_id"]
    worker = start_worker()
    wait_for_state(job_id, State.FAILED, [worker.log])
    assert attempts(job_id) == {"prepare": 1, "pay": 1}
    [final] = final_events(broker, job_id)
    assert final["error"] == {"stage": "pay", "type": "ValueError", "message": "card declined"}


def test_a_long_stage_cancelled_midway_stops_at_its_next_report_and_no_later_stage_starts(
    start_worker, broker, api_client, tmp_path
):
    payload = flaky_payload(tmp_path, wait=4)
    outside_api_down(payload["api"], 0)
    job_id = post_job(api_client, "flaky", payload, key="flaky-cancel").json()["job_id"]
    worker = start_worker()
    wait_for(
        lambda: ("wait", 32) in job_events(broker, "flaky", job_id), timeout=30, message="the long stage"
    )
    response = api_client.post(f"/api/jobs/{job_id}/cancel/")
    assert response.status_code == 202, response.content
    assert response.json()["job_id"] == job_id
    wait_for_state(job_id, State.CANCELLED, [worker.log])

    assert "finish" not in lines(payload["log"])
    stopped = StageRecord.objects.get(job_id=job_id, stage="wait")
    assert (stopped.state, stopped.error_type) == ("CANCELLED", "JobCancelled")
    assert not StageRecord.objects.filter(job_id=job_id, stage="finish").exists()
    events = assert_one_ordered_stream(broker, job_id)
    assert len([e for e in events if e[0] == "wait"]) < 40  # stopped midway
    assert [e["state"] for e in final_events(broker, job_id)] == ["CANCELLED"]
    job = Job.objects.get(pk=job_id)
    assert job.cancel_requested_at is not None and job.completed_at is not None
    again = api_client.post(f"/api/jobs/{job_id}/cancel/")
    assert again.status_code == 409 and again["Content-Type"] == "application/problem+json"


def test_a_failed_job_retried_after_the_api_recovered_reuses_its_finished_stage_and_charges_once(
    start_worker, broker, api_client, tmp_path
):
    """The failed attempts charged the card before their error (the answer was lost): the retry
    calls the API with the old job's key, so the provider charges once in all."""
    payload = flaky_payload(tmp_path, charge_first=True)
    outside_api_down(payload["api"], 100)
    old_id = post_job(api_client, "flaky", payload, key="flaky-old").json()["job_id"]
    worker = start_worker()
    wait_for_state(old_id, State.FAILED, [worker.log])
    old_stream = job_events(broker, "flaky", old_id)

    outside_api_down(payload["api"], 0)  # the API is back
    retried = api_client.post(f"/api/jobs/{old_id}/retry/", HTTP_IDEMPOTENCY_KEY="retry-1")
    assert retried.status_code == 201, retried.content
    new_id = retried.json()["job_id"]
    assert new_id != old_id and retried.json()["retry_of"] == old_id
    replay = api_client.post(f"/api/jobs/{old_id}/retry/", HTTP_IDEMPOTENCY_KEY="retry-1")
    assert replay.status_code == 201 and replay.json() == retried.json()
    assert replay["Idempotent-Replayed"] == "true"
    wait_for_state(new_id, State.COMPLETED, [worker.log])

    key = f"{old_id}:pay"  # the retry chain's first job's key
    assert lines(payload["log"]).count("prepare") == 1  # not run again: its result was reused
    assert lines(payload["log"])[-2:] == [f"pay attempt 1 key {key}", "finish"]
    assert set(outside_api_calls(payload["api"])) == {key}
    assert outside_api_charges(payload["api"]) == {key: 1}
    assert Job.objects.get(pk=old_id).state == State.FAILED
    assert Job.objects.get(pk=new_id).retry_of_id == uuid.UUID(old_id)
    assert attempts(new_id) == {"prepare": 1, "pay": 1, "wait": 1, "finish": 1}
    # Each job keeps its own stream, ordered, with one final event.
    assert job_events(broker, "flaky", old_id) == old_stream
    new_events = assert_one_ordered_stream(broker, new_id)
    assert new_events[0] == ("prepare", 10)  # the reused stage's events republished in its stream
    assert [e["state"] for e in final_events(broker, new_id)] == ["COMPLETED"]
    assert [e["state"] for e in final_events(broker, old_id)] == ["FAILED"]


def test_a_waiting_retry_holds_no_worker_other_jobs_run_meanwhile(start_worker, broker, api_client, tmp_path):
    """One pool process. A stage's retry waits ~8 s (6.4 to 9.6): a job posted after its first
    attempt failed completes while the retry still waits, as it could not if the worker slept."""
    import time

    payload = flaky_payload(tmp_path)
    outside_api_down(payload["api"], 1)
    worker = start_worker()  # concurrency 1
    patient_id = post_job(api_client, "flaky_patient", payload, key="patient").json()["job_id"]
    wait_for(
        lambda: StageRecord.objects.filter(
            job_id=patient_id, stage="pay", next_attempt_at__isnull=False
        ).exists(),
        timeout=30,
        message="the first attempt failed, its retry waiting",
    )
    posted = time.monotonic()
    scan_id = post_job(api_client, "scan", key="meanwhile").json()["job_id"]
    wait_for_state(scan_id, State.COMPLETED, [worker.log])
    took = time.monotonic() - posted
    pay = StageRecord.objects.get(job_id=patient_id, stage="pay")
    assert (pay.state, pay.attempts) == ("RETRYING", 1), f"the scan took {took:.2f}s"
    print(f"a scan job completed {took:.2f}s after its POST while a retry waited")
    wait_for_state(patient_id, State.COMPLETED, [worker.log])
    assert attempts(patient_id)["pay"] == 2
