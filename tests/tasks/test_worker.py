"""The backend's tasks run by a real Celery worker (prefork, concurrency 1, the Redis broker) on
this run's test database: transactional and keyed enqueues, get_result from another process,
queues, Django's task signals, progress events, cancel and retry.

One worker serves the module's tests (shared_worker: the default queue). It runs one task at a
time, in the order they were sent, so a task sent later that ran shows that an earlier one
would have run by then.
"""

import json

import pytest
from django.db import transaction

import eventbus
from eventbus.backends import ExactlyOnceBackend
from eventbus.bus.keys import JobKeys
from eventbus.djangotasks.compat import TaskResultStatus, task_enqueued
from eventbus.djangotasks.names import RUN_STAGE
from eventbus.djangotasks.taskjob import TaskJob
from eventbus.jobtypes import FINAL_STAGE
from eventbus.models import Job
from idempotency.exceptions import IdempotencyKeyMismatch
from tests.eventbus.helpers import queued_task_ids
from tests.processes import wait_for
from tests.tasks import tasks

from .conftest import read_lines, wait_for_state

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

State = Job.State
Status = TaskResultStatus


def test_a_task_enqueued_in_a_rolled_back_transaction_never_runs(shared_worker, broker, tmp_path):
    path = str(tmp_path / "lines")
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = tasks.append_line.enqueue(path, "rolled back")
        raise RuntimeError
    later = tasks.append_line.enqueue(path, "later")
    wait_for_state(later.id, State.COMPLETED, shared_worker)
    assert read_lines(path) == ["later"]
    assert not Job.objects.filter(pk=rolled_back.id).exists()
    assert shared_worker.received(rolled_back.id) == 0 and shared_worker.received(later.id) == 1
    assert queued_task_ids(broker) == []


def test_a_keyed_enqueue_made_twice_is_one_task_run_once(shared_worker, broker, tmp_path):
    path = str(tmp_path / "lines")
    with eventbus.enqueue_key("k"):
        first = tasks.append_line.enqueue(path, "keyed")
    with eventbus.enqueue_key("k"):
        again = tasks.append_line.enqueue(path, "keyed")
    assert again.id == first.id
    wait_for_state(first.id, State.COMPLETED, shared_worker)
    # Made again once it ran: the same task, its result as it stands.
    with eventbus.enqueue_key("k"):
        after = tasks.append_line.enqueue(path, "keyed")
    assert after.id == first.id and after.status == Status.SUCCESSFUL and after.return_value == "keyed"
    with pytest.raises(IdempotencyKeyMismatch), eventbus.enqueue_key("k"):
        tasks.append_line.enqueue(path, "other")

    marker = tasks.append_line.enqueue(path, "marker")  # sent after every enqueue above
    wait_for_state(marker.id, State.COMPLETED, shared_worker)
    assert read_lines(path) == ["keyed", "marker"]
    assert Job.objects.filter(domain="task").count() == 2
    assert shared_worker.received(first.id) == 1


def test_get_result_in_another_process_sees_each_status(shared_worker, broker, result_reader, tmp_path):
    path, gate = str(tmp_path / "lines"), tmp_path / "gate"
    waiting = tasks.report.enqueue("weekly")  # on the "reports" queue, which no worker serves here
    assert result_reader.read(waiting.id)["status"] == "READY"

    held = tasks.hold.enqueue(path, str(gate))
    wait_for(
        lambda: read_lines(path) == ["start"],
        timeout=30,
        message=f"the task started:\n{shared_worker.log(tail=3000)}",
    )
    running = result_reader.read(held.id)
    assert running["status"] == "RUNNING" and running["started"] and not running["finished"]
    assert running["attempts"] == 1, running

    gate.touch()
    wait_for_state(held.id, State.COMPLETED, shared_worker)
    done = result_reader.read(held.id)
    assert (done["status"], done["return_value"], done["errors"]) == ("SUCCESSFUL", "done", [])
    assert done["finished"] and done["worker_ids"] == running["worker_ids"]

    failing = tasks.fail.enqueue("the message")
    wait_for_state(failing.id, State.FAILED, shared_worker)
    failed = result_reader.read(failing.id)
    assert failed["status"] == "FAILED" and failed["return_value"] is None
    [error] = failed["errors"]
    assert error["exception_class_path"] == "builtins.ValueError"
    assert "ValueError: the message" in error["traceback"], error["traceback"]
    assert result_reader.read(waiting.id)["status"] == "READY"  # still: no worker took it


def test_a_queue_is_served_by_its_workers_only(shared_worker, broker, start_worker, tmp_path):
    path = str(tmp_path / "lines")
    on_reports = tasks.append_line.using(queue_name="reports").enqueue(path, "reports")
    on_default = tasks.append_line.enqueue(path, "default")
    # The worker with no -Q ran the default queue's task, sent after the other, and left that one.
    wait_for_state(on_default.id, State.COMPLETED, shared_worker)
    assert read_lines(path) == ["default"]
    assert Job.objects.get(pk=on_reports.id).state == State.PENDING
    assert Job.objects.get(pk=on_reports.id).queue == "reports"
    assert queued_task_ids(broker, "reports") == [on_reports.id]
    assert shared_worker.received(on_reports.id) == 0

    reports_worker = start_worker("tasks-reports", "-Q", "reports")
    wait_for_state(on_reports.id, State.COMPLETED, reports_worker)
    assert read_lines(path) == ["default", "reports"]
    assert reports_worker.received(on_reports.id) == 1 and shared_worker.received(on_reports.id) == 0
    assert reports_worker.received(on_default.id) == 0


def test_djangos_task_signals_are_sent_on_commit_and_by_the_worker(shared_worker, broker):
    enqueued = []

    def on_enqueued(sender, task_result, **kwargs):
        enqueued.append((sender, task_result.id, task_result.status))

    task_enqueued.connect(on_enqueued)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.enqueue(1, 2)
            raise RuntimeError
        assert enqueued == []
        with transaction.atomic():
            added = tasks.add.enqueue(2, 3)
            assert enqueued == []  # not before the commit
        assert enqueued == [(ExactlyOnceBackend, added.id, Status.READY)]
        failing = tasks.fail.enqueue("signalled")
        assert enqueued[1:] == [(ExactlyOnceBackend, failing.id, Status.READY)]
    finally:
        task_enqueued.disconnect(on_enqueued)

    wait_for_state(added.id, State.COMPLETED, shared_worker)
    wait_for_state(failing.id, State.FAILED, shared_worker)
    # Sent in the worker, before the job's end was recorded.
    sent = read_lines(shared_worker.signals_path)
    assert [line for line in sent if added.id in line] == [
        f"task_started {added.id} RUNNING ExactlyOnceBackend",
        f"task_finished {added.id} SUCCESSFUL ExactlyOnceBackend 5",
    ]
    assert [line for line in sent if failing.id in line] == [
        f"task_started {failing.id} RUNNING ExactlyOnceBackend",
        f"task_finished {failing.id} FAILED ExactlyOnceBackend builtins.ValueError",
    ]


def test_a_tasks_progress_reaches_its_jobs_stream_in_order(shared_worker, broker):
    counted = tasks.count_to.enqueue(4)
    wait_for_state(counted.id, State.COMPLETED, shared_worker)
    entries = [
        (fields[b"stage"].decode(), int(fields[b"seq"]), json.loads(fields[b"data"]))
        for _id, fields in broker.xrange(JobKeys("task", counted.id).stream)
        if fields[b"job_id"].decode() == counted.id
    ]
    [run] = TaskJob.plan()
    assert [(stage, seq) for stage, seq, _ in entries] == [
        *((RUN_STAGE, run.seq(i)) for i in range(4)),
        (FINAL_STAGE, TaskJob.final_seq()),
    ]
    assert [data["at"] for _, _, data in entries[:-1]] == [1, 2, 3, 4]  # count_to's data, in its order
    progress = [data["progress"] for _, _, data in entries]
    assert progress == sorted(set(progress)) and progress[-1] == 100, progress  # done/of: rising
    final = entries[-1][2]
    assert final["final"] is True and final["state"] == State.COMPLETED and final["progress"] == 100
    assert tasks.count_to.get_result(counted.id).return_value == {"attempt": 1, "counted": 4}


def test_a_cancelled_running_task_fails_cancelled_and_its_retry_runs(shared_worker, broker, tmp_path):
    path, gate = str(tmp_path / "lines"), tmp_path / "gate"
    held = tasks.hold.enqueue(path, str(gate))
    wait_for(
        lambda: read_lines(path) == ["start"],
        timeout=30,
        message=f"the task started:\n{shared_worker.log(tail=3000)}",
    )
    assert eventbus.cancel_job(held.id).state == State.RUNNING  # asked: its run stops it

    wait_for_state(held.id, State.CANCELLED, shared_worker)
    result = tasks.hold.get_result(held.id)
    assert result.status == Status.FAILED
    assert [error.exception_class_path for error in result.errors] == ["eventbus.jobtypes.JobCancelled"]
    assert read_lines(path) == ["start"]  # stopped before "done"

    gate.touch()
    retry, created = eventbus.retry_job(held.id, key="retry-held")
    assert created and retry.domain == "task" and str(retry.retry_of_id) == held.id
    wait_for_state(retry.pk, State.COMPLETED, shared_worker)
    again = tasks.hold.get_result(str(retry.pk))
    assert again.status == Status.SUCCESSFUL and again.return_value == "done"
    assert read_lines(path) == ["start", "start", "done"]
    assert tasks.hold.get_result(held.id).status == Status.FAILED  # the old task stays as it ended
