"""Durable stages on real processes: a Celery worker, the sweeper (`manage.py sweep_jobs`, which
sends the due WAITING runs) and a private append-only Redis, started once for the module
(tests/eventbus/test_atomic_stages.py's durable_processes).

A sleep holds no worker and outlives SIGKILLs of the worker, the sweeper and Redis; a cancel ends
a waiting job at once. A signal sent from this process wakes a waiting job, one sent early is
taken without a wait, one that never comes times out. A parent's children run once each, even
with the worker killed between their starts and the parent's wait, and a cancel of the parent
cancels them. And signals racing on one job (real threads, SQLite and PostgreSQL): one per name.
"""

from __future__ import annotations

import json

import pytest
from django.utils.dateparse import parse_datetime

from eventbus.bus.keys import JobKeys
from eventbus.exceptions import SignalAlreadySent
from eventbus.models import Job, JobSignal, StageRecord
from eventbus.services import cancel_job, signal_job, start_job
from eventbus.tasks import enqueue
from tests.processes import wait_for
from tests.threads import in_threads

from .helpers import queued_task_ids
from .jobtypes import lines
from .test_atomic_stages import assert_one_stream, durable_processes, final_states, ledger, wait_for_state

pytestmark = pytest.mark.django_db(transaction=True)
State = Job.State

# Seconds a job sleeps while its processes are killed and started again: long enough to see it
# WAITING before it is due (it resumes once they are back, however long that took).
SLEEP = 6


@pytest.fixture(scope="module")
def processes(redis_url, django_db_setup, tmp_path_factory):
    yield from durable_processes(tmp_path_factory, "durable", sweeper=True)


def durable_payload(tmp_path, **extra) -> dict:
    """A DurableJob (tests/eventbus/jobtypes.py) that logs to tmp_path/log; no review unless asked."""
    return {"log": str(tmp_path / "log"), "skip_review": True, **extra}


def messages_of(client, job: Job) -> int:
    """The job's run_job messages in the broker: queued, or delivered and not acknowledged
    (kombu's `unacked` hash: [message, exchange, routing key] by delivery tag)."""
    ids = queued_task_ids(client)
    ids += [json.loads(raw)[0]["headers"]["id"] for raw in client.hvals("unacked")]
    return ids.count(str(job.id))


def assert_held_by_no_worker(processes, job: Job) -> None:
    """WAITING, its run not sent, and no run of it anywhere: its task acknowledged (none in the
    queue or the unacked hash) and no run lease."""
    assert job.state == State.WAITING and job.enqueued_at is None
    with processes.client() as client:
        wait_for(lambda: messages_of(client, job) == 0, timeout=30, message="the run's task acknowledged")
        assert not client.exists(JobKeys(job.domain, str(job.id)).run_lease)


# A durable sleep -------------------------------------------------------------------------------


@pytest.mark.processes
def test_a_sleep_holds_no_worker_and_outlives_restarts_of_the_worker_the_sweeper_and_redis(
    processes, user, tmp_path
):
    log = tmp_path / "log"
    job, _ = start_job("durable", durable_payload(tmp_path, sleep=SLEEP), key="sleeper", owner=user)
    job = wait_for_state(job.id, State.WAITING, processes)
    pause = StageRecord.objects.get(job=job, stage="pause")
    due = parse_datetime(pause.waits["sleep:1"])
    assert (pause.state, pause.waiting_for, job.run_after) == ("WAITING", "sleep", due)
    assert_held_by_no_worker(processes, job)
    assert lines(log) == ["pay", "pause-before"]

    processes.restart()
    job = wait_for_state(job.id, State.COMPLETED, processes)
    # The stage ran again from its start (its code before the sleep too), past the sleep once.
    assert lines(log) == ["pay", "pause-before", "pause-before", "pause-after"]
    pause.refresh_from_db()
    assert pause.attempts == 1, "a resumption is not another attempt"
    assert pause.finished_at >= due
    assert len(ledger(job.id)) == 1, "the atomic stage before it did not run again"
    assert processes.worker.log().count(f"Job {job.id} COMPLETED") == 1
    with processes.client() as client:
        # What the stream held before Redis was killed is there once (its append-only file).
        per_stage = assert_one_stream(client, "durable", job.id)
        assert per_stage == {"pay": 1, "pause": 1, "review": 1, "fan_out": 1, "done": 1}
        assert final_states(client, "durable", job.id) == ["COMPLETED"]


@pytest.mark.processes
def test_a_cancel_ends_a_sleeping_job_at_once_and_no_run_follows(processes, user, tmp_path):
    log = tmp_path / "log"
    job, _ = start_job("durable", durable_payload(tmp_path, sleep=3600), key="cancelled", owner=user)
    job = wait_for_state(job.id, State.WAITING, processes)
    assert_held_by_no_worker(processes, job)

    assert cancel_job(job.id).state == State.CANCELLED
    job.refresh_from_db()
    assert job.state == State.CANCELLED and job.completed_at is not None
    assert StageRecord.objects.get(job=job, stage="pause").state == "CANCELLED"
    # A stray message of its run (a duplicate delivery) finds it ended, and runs nothing.
    assert enqueue(job)
    wait_for(
        lambda: f"Job {job.id} is CANCELLED already; not run again" in processes.worker.log(),
        timeout=60,
        message=f"the stray run:\n{processes.logs()}",
    )
    assert lines(log) == ["pay", "pause-before"]
    assert Job.objects.get(pk=job.id).state == State.CANCELLED
    with processes.client() as client:
        assert final_states(client, "durable", job.id) == ["CANCELLED"]


# Signals ---------------------------------------------------------------------------------------


@pytest.mark.processes
def test_a_signal_wakes_a_waiting_job_and_the_worker_completes_it(processes, user, tmp_path):
    log = tmp_path / "log"
    job, _ = start_job("durable", {"log": str(log)}, key="reviewed", owner=user)
    job = wait_for_state(job.id, State.WAITING, processes)
    review = StageRecord.objects.get(job=job, stage="review")
    assert (review.waiting_for, job.run_after) == ("signal:approve", None), "woken by the signal alone"
    assert_held_by_no_worker(processes, job)

    sent, created = signal_job(job.id, "approve", {"by": "ann"}, key="approve-1")
    assert created
    wait_for_state(job.id, State.COMPLETED, processes)
    review.refresh_from_db()
    assert (review.result, review.attempts, review.waiting_for) == ({"approved": "ann"}, 1, None)
    assert lines(log).count("approved ann") == 1
    sent.refresh_from_db()
    assert sent.delivered_at is not None
    # Sent again by a client's retry: the same signal, nothing new to run.
    assert signal_job(job.id, "approve", {"by": "ann"}, key="approve-1") == (sent, False)


@pytest.mark.processes
def test_a_signal_sent_before_the_stage_waits_is_taken_without_a_wait(processes, make_job, tmp_path):
    log = tmp_path / "log"
    job = make_job("durable", {"log": str(log)})  # accepted, its run not sent yet
    signal_job(job.id, "approve", {"by": "bob"}, key="early")
    assert enqueue(job)
    wait_for_state(job.id, State.COMPLETED, processes)
    review = StageRecord.objects.get(job=job, stage="review")
    assert (review.result, review.attempts) == ({"approved": "bob"}, 1)
    assert f"Job {job.id} WAITING" not in processes.worker.log(), "it never waited"
    assert lines(log) == ["pay", "pause-before", "pause-after", "approved bob"]


@pytest.mark.processes
def test_a_signal_that_never_comes_times_out_and_the_stage_retries_as_its_policy_says(
    processes, user, tmp_path
):
    log = tmp_path / "log"
    job, _ = start_job("review_retried", {"log": str(log), "timeout": 1}, key="forgotten", owner=user)
    wait_for_state(job.id, State.FAILED, processes)
    review = StageRecord.objects.get(job=job, stage="review")
    assert (review.attempts, review.error_type, review.finished_at) == (2, "StageTimeout", None)
    assert review.error_class == "eventbus.jobtypes.StageTimeout"
    # Each attempt waited (WAITING: the sweeper sent it once the timeout was due) and timed
    # out: the retry waited afresh (a timed-out wait is forgotten), no signal came, nothing was
    # approved.
    assert lines(log) == ["review attempt 1", "review attempt 1", "review attempt 2", "review attempt 2"]
    assert f"Job {job.id} WAITING" in processes.worker.log()
    with processes.client() as client:
        assert final_states(client, "review_retried", job.id) == ["FAILED"]


# Children --------------------------------------------------------------------------------------


def fan_out_payload(tmp_path, **extra) -> dict:
    return {
        "log": str(tmp_path / "log"),
        "children": 3,
        "child_payload": {"log": str(tmp_path / "children")},
        **extra,
    }


def assert_children_ran_once_each(job: Job, tmp_path) -> list[Job]:
    children = list(Job.objects.filter(parent=job).order_by("accepted_at"))
    assert len(children) == 3, children
    assert {(child.domain, child.state, child.owner_id) for child in children} == {
        ("staged", State.COMPLETED, job.owner_id)
    }
    assert sorted(child.payload["i"] for child in children) == [0, 1, 2]
    child_log = lines(tmp_path / "children")
    assert (child_log.count("first"), child_log.count("third")) == (3, 3), child_log
    for child in children:
        assert dict(StageRecord.objects.filter(job=child).values_list("stage", "attempts")) == {
            "first": 1,
            "second": 1,
            "third": 1,
        }
    return children


@pytest.mark.processes
def test_a_parent_waits_for_its_children_and_completes_with_their_outcomes(processes, user, tmp_path):
    job, _ = start_job("fan_out", fan_out_payload(tmp_path), key="parent", owner=user)
    job = wait_for_state(job.id, State.COMPLETED, processes)
    assert_children_ran_once_each(job, tmp_path)
    fan_out = StageRecord.objects.get(job=job, stage="fan_out")
    assert [child["state"] for child in fan_out.result["children"]] == ["COMPLETED"] * 3
    assert all(child["results"]["third"]["done"] for child in fan_out.result["children"])
    assert fan_out.attempts == 1
    # The parent waited (its worker free for the children), then ran the stage again, once.
    assert f"Job {job.id} WAITING" in processes.worker.log()
    assert lines(tmp_path / "log") == ["started 3", "started 3"]
    with processes.client() as client:
        assert final_states(client, "fan_out", job.id) == ["COMPLETED"]


@pytest.mark.processes
def test_a_worker_killed_between_the_starts_and_the_wait_starts_no_child_twice(processes, user, tmp_path):
    marker = tmp_path / "marker"
    payload = fan_out_payload(tmp_path, pause_at="after_children", marker=str(marker))
    job, _ = start_job("fan_out", payload, key="parent-killed", owner=user)
    wait_for(marker.exists, timeout=60, message=f"the fan-out's pause:\n{processes.logs()}")
    assert Job.objects.filter(parent=job).count() == 3
    processes.worker.kill()  # SIGKILL, the whole worker: its task waits in the unacked hash
    processes.worker.start(timeout=60)

    job = wait_for_state(job.id, State.COMPLETED, processes, timeout=120)
    children = assert_children_ran_once_each(job, tmp_path)
    fan_out = StageRecord.objects.get(job=job, stage="fan_out")
    assert fan_out.attempts == 2
    assert sorted(fan_out.waits[f"child:{i}"] for i in (1, 2, 3)) == sorted(str(c.id) for c in children)
    assert [child["state"] for child in fan_out.result["children"]] == ["COMPLETED"] * 3


@pytest.mark.processes
def test_cancelling_a_waiting_parent_cancels_its_waiting_children(processes, user, tmp_path):
    child_payload = {"log": str(tmp_path / "children"), "skip_review": True, "sleep": 3600}
    payload = fan_out_payload(tmp_path, child="durable", child_payload=child_payload)
    job, _ = start_job("fan_out", payload, key="parent-cancelled", owner=user)
    wait_for_state(job.id, State.WAITING, processes)
    wait_for(
        lambda: list(Job.objects.filter(parent=job).values_list("state", flat=True)) == [State.WAITING] * 3,
        timeout=60,
        message=f"three children sleeping:\n{processes.logs()}",
    )

    assert cancel_job(job.id).state == State.CANCELLED
    assert Job.objects.get(pk=job.id).state == State.CANCELLED
    assert list(Job.objects.filter(parent=job).values_list("state", flat=True)) == [State.CANCELLED] * 3
    assert StageRecord.objects.get(job=job, stage="fan_out").state == "CANCELLED"
    assert set(
        StageRecord.objects.filter(job__parent=job, stage="pause").values_list("waiting_for", flat=True)
    ) == {None}
    assert lines(tmp_path / "children").count("pause-after") == 0


# Signals racing on one job ---------------------------------------------------------------------


def signals_at_once(job: Job, keys: list[str], payloads: list[dict]) -> list:
    """signal_job of each key and payload, all at once (real threads); each outcome, or the
    SignalAlreadySent raised."""

    def send(i):
        try:
            return signal_job(job.id, "approve", payloads[i], key=keys[i])
        except SignalAlreadySent as refused:
            return refused

    return in_threads(len(keys), send)


def race_under_many_keys(job: Job) -> None:
    outcomes = signals_at_once(job, [f"key-{i}" for i in range(8)], [{"by": f"user-{i}"} for i in range(8)])
    sent = [outcome for outcome in outcomes if not isinstance(outcome, SignalAlreadySent)]
    refused = [outcome for outcome in outcomes if isinstance(outcome, SignalAlreadySent)]
    assert len(sent) == 1 and len(refused) == 7, outcomes
    [(signal, created)] = sent
    assert created
    stored = JobSignal.objects.get(job=job)
    assert (stored.pk, stored.idem_key, stored.payload) == (signal.pk, signal.idem_key, signal.payload)


def race_under_one_key(job: Job) -> None:
    outcomes = signals_at_once(job, ["key"] * 8, [{"by": "ann"}] * 8)
    assert not any(isinstance(outcome, Exception) for outcome in outcomes), outcomes
    assert {signal.pk for signal, _created in outcomes} == {JobSignal.objects.get(job=job).pk}
    assert [created for _signal, created in outcomes].count(True) == 1


RACES = [race_under_many_keys, race_under_one_key]


@pytest.mark.parametrize("race", RACES, ids=["many keys", "one key"])
def test_signals_racing_on_one_job_give_one_signal(make_job, tmp_path, race):
    race(make_job("durable", durable_payload(tmp_path)))


@pytest.mark.postgres
@pytest.mark.parametrize("race", RACES, ids=["many keys", "one key"])
def test_signals_racing_on_one_job_give_one_signal_on_postgresql(make_job, tmp_path, race):
    race(make_job("durable", durable_payload(tmp_path)))
