"""django-tasks' backend tests, ported to ExactlyOnceBackend.

From django-tasks (https://github.com/RealOrangeOne/django-tasks), at commit 17bd95f (the last
before its database and RQ backends moved to packages of their own): tests/tests/
test_database_backend.py ("DB" below), tests/tests/test_rq_backend.py ("RQ") and their tasks,
tests/tasks.py (here tests/tasks/ported_tasks.py). Where an original runs its worker in-process
(db_worker's run, RQ's burst SimpleWorker), a real Celery worker runs the task here (prefork, the
Redis broker, this run's test database) and the test waits for its outcome. Query counts
(assertNumQueries) are left out throughout: they count the other backends' queries.

django-tasks is under the BSD 3-Clause license, whose notice its first condition asks to keep:

    Copyright (c) Jake Howard and individual contributors.
    All rights reserved.

    Redistribution and use in source and binary forms, with or without modification,
    are permitted provided that the following conditions are met:

        1. Redistributions of source code must retain the above copyright notice,
           this list of conditions and the following disclaimer.

        2. Redistributions in binary form must reproduce the above copyright
           notice, this list of conditions and the following disclaimer in the
           documentation and/or other materials provided with the distribution.

        3. Neither the name of the copyright holder nor the names of its
           contributors may be used to endorse or promote products derived from
           this software without specific prior written permission.

    THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS" AND
    ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE IMPLIED
    WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
    DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT OWNER OR CONTRIBUTORS BE LIABLE FOR
    ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL DAMAGES
    (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES;
    LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON
    ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT
    (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE OF THIS
    SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.

Of the originals' 123 tests, 44 are ported (their assertions, on this backend), 28 adapted and
51 do not apply. By behaviour (the name here, when it differs, after the arrow):

Enqueue
- Ported: DB and RQ test_using_correct_backend, test_enqueue_task, test_enqueue_task_async
  (each with a sync and an async task; task_enqueued's sender and result), test_enqueue_logs
  (Django's own receiver of task_enqueued logs it), test_validate_on_enqueue,
  test_validate_on_aenqueue; DB test_run_after_tz.
- Adapted: DB test_priority_range_check (no database constraint here: Django's validation refuses
  -101, 101 and 3.1 at .using(); -100, 0 and 100 are kept with the job); DB and RQ
  test_doesnt_wait_until_transaction_commit -> test_the_run_is_sent_once_the_transaction_commits
  (by design the other way round: the job is written in the transaction, its run sent on commit);
  RQ test_queue_isolation (each Celery queue holds its own tasks' messages; a queue is read only
  where no worker of this module serves it).
- Added: test_arguments_are_normalised_and_non_json_refused; the using() variants,
  test_using_variants and test_using_another_backend_alias.

get_result, refresh, aget_result, arefresh
- Ported: DB and RQ test_get_result, test_get_result_async, test_get_missing_result,
  test_async_get_missing_result, test_invalid_uuid, test_async_invalid_uuid; RQ
  test_refresh_result, test_refresh_result_async (a worker runs the task); DB
  test_missing_task_path (get_result raises ImportError).
- Adapted: DB test_refresh_result, test_refresh_result_async (a worker runs the task, where the
  original writes its outcome into the row); DB and RQ test_invalid_task_path (a job whose
  payload names no Task: get_result raises TypeError, not SuspiciousOperation); DB
  test_cross_connection (another connection sees the tasks' jobs).
- Added: test_a_job_that_is_no_task_is_no_result.

Check framework (Django's run_checks, with TASKS on this backend)
- Ported: DB and RQ test_check.
- Adapted: DB test_custom_id_function, test_unknown_id_function -> test_unknown_id_function (the
  id is the job's UUID4: an `id_function` option is refused, eventbus.E020); RQ
  test_unknown_queue_name (a QUEUES name that is no Celery queue name, eventbus.E021).

Running: statuses, timestamps, queues, run_after, context
- Ported: DB test_run_enqueued_task (with the async task too, which the original leaves out),
  test_run_subprocess (every worker here is a process), test_batch_processes_all_tasks; DB and RQ
  test_takes_context.
- Adapted: DB and RQ test_context (no metadata to check: neither django.tasks nor the backport
  0.12 has TaskContext.metadata); DB test_doesnt_process_different_queue and
  test_process_all_queues -> test_doesnt_process_different_queue (Celery queues: a worker with no
  -Q serves the default queue only, one with -Q celery,reports both); DB test_run_after (the
  sweeper, sweep_jobs, sends the run once due, where the original's worker polls the table); DB
  test_run_after_priority (the sweeper sends the due runs the most overdue first, then the
  highest priority, where the original orders by priority first; a task without run_after is
  sent at once, so the order is read from the broker's queue); DB test_multiple_workers (two
  Celery workers of one queue: each task received once, by one of them).

Errors and return values
- Ported: DB test_failing_task, test_worker_doesnt_exit, test_system_exit_task,
  test_keyboard_interrupt_task and RQ test_catches_exception -> test_failing_task (ValueError,
  SystemExit, KeyboardInterrupt, exit(1): FAILED with the exception's class and traceback, and the
  worker goes on); DB and RQ test_complex_exception.
- Adapted: DB and RQ test_complex_return_value (TypeError from Django's normalize_json, "Unsupported
  type", where the database backend's JSONField and RQ's serializer had messages of their own);
  DB test_invalid_task_path, test_missing_task_path and test_task_import_string on a worker ->
  test_task_jobs_naming_no_task_fail_without_running_anything (FAILED, read from the job and its
  stage record, as get_result cannot name a Task that does not import; what the payload names is
  never called); RQ test_exception_classes_pop_empty_list_bug (a failure recorded without its
  class reads builtins.Exception; a task cancelled before it started reads
  eventbus.jobtypes.JobCancelled).
- Added: test_return_values_are_normalised (tuples and bytes normalised as Django's
  normalize_json does; a Decimal, which DjangoJSONEncoder would take, fails the task, as with
  Django's own backends).

Signals
- Ported: RQ test_started_finished_logs and test_failed_logs -> test_started_finished_logs
  (Django's own receivers of task_started and task_finished log each once, in the worker);
  task_enqueued in test_enqueue_task.

Attempts and worker ids (a worker stopped or killed)
- Adapted: DB test_interrupt_signals (SIGTERM and one Ctrl-C: the running task completes; Celery
  exits 1 after a Ctrl-C); DB test_repeat_ctrl_c (by design: the attempt cut by Celery's cold
  shutdown is lost, not failed, and the task runs again on the next worker, attempts 2); DB
  test_kill -> test_kill_a_pool_process_mid_task (by design: the run is delivered again and the
  task completes, attempts 2, a worker id each, where the original's task stays RUNNING for good,
  its issue #46).

Not applicable
- The database backend's own model, queries and locks: DB test_task_name,
  test_index_scan_for_ready, test_run_after_null_0016_migration, test_postgres_db_id_function,
  test_postgres_id_function_expression, test_no_tasks, test_worker_with_locked_rows,
  test_locks_tasks, test_locks_tasks_sqlite, test_locks_tasks_filtered,
  test_locks_tasks_filtered_sqlite, test_lock_no_rows, test_get_locked_with_locked_rows,
  test_non_sqlite, test_old_django_requires_manual_transaction, test_explicit_transaction,
  test_exclusive_transaction (one run at a time is the run lease's here, eventbus.job.runs).
- Its db_worker command: DB test_unknown_backend, test_incorrect_backend, test_negative_interval,
  test_infinite_interval, test_fractional_interval, test_negative_max_tasks,
  test_too_long_worker_id, test_empty_worker_id, test_verbose_logging, test_max_tasks,
  test_interrupt_no_tasks, test_doesnt_process_different_backend (a Celery worker runs the tasks
  of every alias its queues carry; the alias a task keeps is test_using_another_backend_alias's).
- Its prune_db_task_results command (a job's retention is the toolkit's own): DB
  test_prunes_tasks, test_doesnt_prune_new_tasks, test_doesnt_prune_running_tasks,
  test_only_prunes_specified_queue, test_prune_all_queues, test_min_age, test_failed_min_age,
  test_dry_run, and the command's test_unknown_backend, test_incorrect_backend, test_negative_age.
- Task metadata, which neither django.tasks nor the backport 0.12 has: DB and RQ test_metadata,
  test_save_metadata.
- The original test project's views: DB and RQ test_meaning_of_life_view,
  test_get_result_from_different_request (the demo's task view is tests/test_demo_tasks.py's,
  get_result in another process tests/tasks/test_worker.py's).
- An app to install or RQ's own queues: DB test_database_backend_app_missing, RQ
  test_rq_app_missing, test_uses_rq_queues_for_queue_names.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test.utils import override_settings
from django.utils import timezone

import eventbus
from eventbus.backends import ExactlyOnceBackend
from eventbus.djangotasks import compat
from eventbus.djangotasks.names import RUN_STAGE
from eventbus.djangotasks.taskjob import TaskJob
from eventbus.models import Job, StageRecord
from eventbus.services import start_job
from tests.eventbus.helpers import queued_task_ids
from tests.processes import Worker, wait_for
from tests.tasks import ported_tasks as test_tasks

from .conftest import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)

Status = compat.TaskResultStatus
InvalidTask = compat.InvalidTask
# Django's own receivers of its task signals log on this logger ("django.tasks" on Django 6).
TASKS_LOGGER = compat.API
TASKS_SETTINGS = {
    "default": {"BACKEND": "eventbus.backends.ExactlyOnceBackend", "QUEUES": ["default", "reports"]}
}


# Fixtures (broker and start_worker: tests/tasks/conftest.py) ---------------------------------


@pytest.fixture(scope="module")
def worker(redis_url, django_db_setup):
    """One Celery worker (prefork, concurrency 1, the default queue: no -Q) for the module's
    tests, in place of the original's in-process db_worker and RQ burst worker. Each test
    waits for its own tasks' end."""
    process = celery_worker("ported")
    process.start(timeout=60)
    yield process
    process.stop()
    process.log_path.unlink(missing_ok=True)


@pytest.fixture
def enqueued_signals():
    """The task_enqueued signals sent while the test runs: (sender, task_result)."""
    received = []

    def capture(sender, task_result, **kwargs):
        received.append((sender, task_result))

    compat.task_enqueued.connect(capture, dispatch_uid="ported_enqueued", weak=False)
    yield received
    compat.task_enqueued.disconnect(capture, dispatch_uid="ported_enqueued")


def backend():
    return compat.task_backends["default"]


def finished(result_id, *workers: Worker, timeout: float = 60):
    """The task's result once it has finished (SUCCESSFUL or FAILED), read by get_result()."""

    def done():
        return backend().get_result(result_id).is_finished

    try:
        wait_for(done, timeout=timeout, interval=0.05, message=f"task {result_id} to finish")
    except AssertionError:
        logs = "\n".join(w.log(tail=4000) for w in workers)
        status = backend().get_result(result_id).status
        raise AssertionError(f"task {result_id} is {status}, not finished; logs:\n{logs}") from None
    return backend().get_result(result_id)


def refreshed(result, *workers: Worker):
    """`result`, refreshed once its task has finished."""
    finished(result.id, *workers)
    result.refresh()
    return result


def lines(path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def started(path, worker: Worker) -> None:
    """Once wait_for_gate has started (its first attempt), on `worker`."""
    try:
        wait_for(lambda: lines(path) == ["start 1"], timeout=30, message="the task to start")
    except AssertionError:
        raise AssertionError(f"the task did not start; its worker's log:\n{worker.log(tail=3000)}") from None


def hand_made_task_job(task_path: str, args=()):
    """A task's job whose payload names `task_path`: what a forged or stale row would hold."""
    payload = {
        "task": task_path,
        "args": list(args),
        "kwargs": {},
        "queue_name": "default",
        "backend": "default",
        "takes_context": False,
    }
    job, _ = start_job(TaskJob, payload, key=f"hand-made-{uuid.uuid4().hex}", owner=None, scope="-")
    return job


def tasks_seen_elsewhere() -> int:
    """How many task jobs another database connection sees."""
    sql, params = Job.objects.filter(domain="task").values("id").query.sql_with_params()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(sql, params)
            return len(cursor.fetchall())
    finally:
        other.close()


def assert_timestamps(result):
    assert result.started_at is not None and result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at


# Enqueue ------------------------------------------------------------------------------------


def test_using_correct_backend():
    default = backend()
    assert isinstance(default, ExactlyOnceBackend)
    assert default.alias == "default"
    assert default.options == {}
    assert default.queues == {"default", "reports"}
    assert test_tasks.noop_task.get_backend() is default


@pytest.mark.parametrize("task", [test_tasks.noop_task, test_tasks.noop_task_async], ids=["sync", "async"])
def test_enqueue_task(task, enqueued_signals):
    result = task.enqueue(1, two=3)

    assert uuid.UUID(result.id).version == 4
    assert result.status == Status.READY
    assert not result.is_finished
    assert result.enqueued_at is not None
    assert result.started_at is None and result.last_attempted_at is None and result.finished_at is None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == task
    assert result.args == [1] and result.kwargs == {"two": 3}
    assert result.attempts == 0 and result.worker_ids == [] and result.errors == []
    assert result.backend == "default"
    assert enqueued_signals == [(ExactlyOnceBackend, result)]


@pytest.mark.parametrize("task", [test_tasks.noop_task, test_tasks.noop_task_async], ids=["sync", "async"])
async def test_enqueue_task_async(task, enqueued_signals):
    result = await task.aenqueue()

    assert uuid.UUID(result.id).version == 4
    assert result.status == Status.READY
    assert not result.is_finished
    assert result.started_at is None and result.last_attempted_at is None and result.finished_at is None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == task
    assert result.args == [] and result.kwargs == {}
    assert result.attempts == 0
    assert enqueued_signals == [(ExactlyOnceBackend, result)]


def test_arguments_are_normalised_and_non_json_refused():
    result = test_tasks.noop_task.enqueue((1, 2), b"bytes", nested={"t": (3,)})
    assert result.args == [[1, 2], "bytes"] and result.kwargs == {"nested": {"t": [3]}}
    assert backend().get_result(result.id).args == [[1, 2], "bytes"]
    for bad in (object(), {1, 2}, timezone.now(), float("nan")):
        with pytest.raises(TypeError, match="arguments must be JSON"):
            test_tasks.noop_task.enqueue(bad)
    assert Job.objects.filter(domain="task").count() == 1


def test_enqueue_logs(caplog):
    with caplog.at_level(logging.DEBUG, TASKS_LOGGER):
        result = test_tasks.noop_task.enqueue()
    [record] = [r for r in caplog.records if r.name == TASKS_LOGGER]
    assert "enqueued" in record.getMessage() and result.id in record.getMessage()


def test_validate_on_enqueue():
    with override_settings(TASKS={"default": {**TASKS_SETTINGS["default"], "QUEUES": ["unknown_queue"]}}):
        task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")

    with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        task_with_custom_queue_name.enqueue()
    assert not Job.objects.exists()


async def test_validate_on_aenqueue():
    with override_settings(TASKS={"default": {**TASKS_SETTINGS["default"], "QUEUES": ["unknown_queue"]}}):
        task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")

    with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        await task_with_custom_queue_name.aenqueue()


def test_priority_range_check():
    for priority in (101, -101, 3.1):
        with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
            test_tasks.noop_task.using(priority=priority)
    for priority in (100, -100, 0):
        result = test_tasks.noop_task.using(priority=priority).enqueue()
        assert Job.objects.get(pk=result.id).priority == priority
        assert backend().get_result(result.id).task.priority == priority


def test_run_after_tz():
    for use_tz in (True, False):
        with override_settings(USE_TZ=use_tz):
            result = test_tasks.noop_task.enqueue()
            assert backend().get_result(result.id).task.run_after is None
    later = timezone.now() + timedelta(hours=10)
    delayed = test_tasks.noop_task.using(run_after=later).enqueue()
    assert delayed.task.run_after == later
    assert backend().get_result(delayed.id).task.run_after == later
    assert Job.objects.get(pk=delayed.id).run_after == later
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        test_tasks.noop_task.using(run_after=later.replace(tzinfo=None))


def test_using_variants():
    tasks = {
        "default": test_tasks.noop_task,
        "bare": test_tasks.noop_task_from_bare_decorator,
        "priority": test_tasks.noop_task.using(priority=7),
        "queue": test_tasks.noop_task.using(queue_name="reports"),
        "both": test_tasks.noop_task.using(queue_name="reports", priority=-3),
    }
    for name, task in tasks.items():
        result = task.enqueue(name)
        job = Job.objects.get(pk=result.id)
        assert (job.priority, job.payload["queue_name"]) == (task.priority, task.queue_name), name
        assert job.queue == ("" if task.queue_name == "default" else task.queue_name), name
        again = backend().get_result(result.id)
        assert again.task == task and again == result, name


def test_using_another_backend_alias():
    two = {**TASKS_SETTINGS, "other": {"BACKEND": "eventbus.backends.ExactlyOnceBackend"}}
    with override_settings(TASKS=two):
        result = test_tasks.calculate_meaning_of_life.using(backend="other").enqueue()
        assert result.backend == "other" and result.task.backend == "other"
        assert Job.objects.get(pk=result.id).payload["backend"] == "other"
        again = compat.task_backends["other"].get_result(result.id)
        assert again.backend == "other" and again.task.get_backend() is compat.task_backends["other"]
        with pytest.raises(InvalidTask, match="Queue 'reports' is not valid for backend"):
            test_tasks.noop_task.using(backend="other", queue_name="reports")


# Results ------------------------------------------------------------------------------------


def test_get_result():
    result = backend().enqueue(test_tasks.noop_task, [], {})
    new_result = backend().get_result(result.id)
    assert result == new_result
    assert test_tasks.noop_task.get_result(result.id) == result


async def test_get_result_async():
    result = await backend().aenqueue(test_tasks.noop_task, [], {})
    new_result = await backend().aget_result(result.id)
    assert result == new_result
    assert await test_tasks.noop_task.aget_result(result.id) == result


def test_get_missing_result():
    with pytest.raises(compat.TaskResultDoesNotExist):
        backend().get_result(str(uuid.uuid4()))


async def test_async_get_missing_result():
    with pytest.raises(compat.TaskResultDoesNotExist):
        await backend().aget_result(str(uuid.uuid4()))


def test_invalid_uuid():
    with pytest.raises(compat.TaskResultDoesNotExist):
        backend().get_result("123")


async def test_async_invalid_uuid():
    with pytest.raises(compat.TaskResultDoesNotExist):
        await backend().aget_result("123")


def test_a_job_that_is_no_task_is_no_result():
    job = Job.objects.create(
        scope="-", idem_key="not-a-task", domain="scan", event_type="job.requested", payload={}
    )
    with pytest.raises(compat.TaskResultDoesNotExist):
        backend().get_result(str(job.pk))


def test_cross_connection():
    test_tasks.noop_task.enqueue()
    test_tasks.noop_task.enqueue()
    assert Job.objects.filter(domain="task").count() == 2
    assert tasks_seen_elsewhere() == 2


def test_invalid_task_path():
    job = hand_made_task_job("subprocess.check_output", [["exit", "1"]])
    with pytest.raises(TypeError, match="'subprocess.check_output' is not a django.tasks task"):
        backend().get_result(str(job.pk))


def test_missing_task_path():
    job = hand_made_task_job("missing.func")
    with pytest.raises(ImportError, match="The task 'missing.func' cannot be imported"):
        backend().get_result(str(job.pk))


# Checks -------------------------------------------------------------------------------------


def task_check_ids() -> list[str]:
    """The ids of the errors Django's check framework finds in TASKS (with our backend's own)."""
    return [str(message.id) for message in run_checks() if (message.id or "").startswith("eventbus.E02")]


def test_check():
    assert list(backend().check()) == []
    assert task_check_ids() == []


def test_unknown_id_function():
    options = {"default": {**TASKS_SETTINGS["default"], "OPTIONS": {"id_function": "uuid.uuid1"}}}
    with override_settings(TASKS=options):
        [error] = backend().check()
        assert error.id == "eventbus.E020" and "id_function" in error.msg
        assert task_check_ids() == ["eventbus.E020"]


def test_unknown_queue_name():
    queues = {"default": {**TASKS_SETTINGS["default"], "QUEUES": ["default", "queue 2"]}}
    with override_settings(TASKS=queues):
        [error] = backend().check()
        assert error.id == "eventbus.E021" and "queue 2" in error.msg
        assert task_check_ids() == ["eventbus.E021"]


# Transactions and queues on the broker --------------------------------------------------------


def test_the_run_is_sent_once_the_transaction_commits(broker):
    """The original's test_doesnt_wait_until_transaction_commit, turned around: the task's job is
    written in the transaction, its run sent once it commits."""
    task = test_tasks.noop_task.using(queue_name="reports")  # no worker of this module serves it
    with transaction.atomic():
        result = task.enqueue()
        assert result.enqueued_at is not None
        assert Job.objects.filter(pk=result.id).count() == 1
        if connection.vendor != "sqlite":  # SQLite locks the database during the transaction
            assert tasks_seen_elsewhere() == 0
        assert queued_task_ids(broker, "reports") == []
    assert tasks_seen_elsewhere() == 1
    assert queued_task_ids(broker, "reports") == [result.id]


def test_queue_isolation(broker):
    default_task = test_tasks.noop_task.enqueue()
    other_task = test_tasks.noop_task.using(queue_name="reports").enqueue()
    backend().get_result(default_task.id)
    backend().get_result(other_task.id)
    assert queued_task_ids(broker, "reports") == [other_task.id]
    assert (
        Job.objects.get(pk=default_task.id).queue == ""
        and Job.objects.get(pk=other_task.id).queue == "reports"
    )


def test_run_after_priority(broker):
    """The sweeper sends the runs due, the most overdue first, then the highest priority (the
    original's database backend orders by priority first)."""
    now = timezone.now()
    reports = test_tasks.noop_task.using(queue_name="reports", run_after=now + timedelta(hours=1))
    very_old = reports.using(priority=0).enqueue()
    old = reports.using(priority=20).enqueue()
    old_low = reports.using(priority=-2).enqueue()
    old_high = reports.using(priority=10).enqueue()
    future = reports.enqueue()
    high_priority_far_future = reports.using(priority=10).enqueue()
    for result, run_after in [
        (very_old, now - timedelta(hours=10)),
        (old, now - timedelta(hours=2)),
        (old_low, now - timedelta(hours=2)),
        (old_high, now - timedelta(hours=2)),
        (future, now + timedelta(hours=2)),
        (high_priority_far_future, now + timedelta(hours=10)),
    ]:
        Job.objects.filter(pk=result.id).update(run_after=run_after)
    assert queued_task_ids(broker, "reports") == []

    call_command("sweep_jobs", burst=True)
    sent = list(reversed(queued_task_ids(broker, "reports")))  # the order a worker takes them
    assert sent == [very_old.id, old.id, old_high.id, old_low.id]
    assert backend().get_result(future.id).status == Status.READY


# On a worker ----------------------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.parametrize("task", [test_tasks.noop_task, test_tasks.noop_task_async], ids=["sync", "async"])
def test_run_enqueued_task(task, worker, broker):
    result = task.enqueue()
    assert result.status == Status.READY

    finished(result.id, worker)
    assert result.status == Status.READY and result.attempts == 0  # until refreshed
    result.refresh()
    assert_timestamps(result)
    assert result.status == Status.SUCCESSFUL and result.return_value is None
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert worker.received(result.id) == 1


@pytest.mark.processes
def test_refresh_result(worker, broker):
    result = backend().enqueue(test_tasks.calculate_meaning_of_life, (), {})
    finished(result.id, worker)

    assert result.status == Status.READY
    assert not result.is_finished
    assert result.started_at is None and result.last_attempted_at is None and result.finished_at is None
    assert result.attempts == 0

    result.refresh()
    assert_timestamps(result)
    assert result.status == Status.SUCCESSFUL and result.is_finished
    assert result.return_value == 42
    assert result.attempts == 1


@pytest.mark.processes
async def test_refresh_result_async(worker, broker):
    result = await backend().aenqueue(test_tasks.calculate_meaning_of_life, (), {})
    await sync_to_async(finished)(result.id, worker)
    assert result.status == Status.READY and result.attempts == 0

    await result.arefresh()
    assert_timestamps(result)
    assert result.status == Status.SUCCESSFUL and result.is_finished
    assert result.return_value == 42
    assert result.attempts == 1


@pytest.mark.processes
def test_batch_processes_all_tasks(worker, broker):
    results = [test_tasks.noop_task.enqueue() for _ in range(3)]
    results.append(test_tasks.failing_task_value_error.enqueue())
    statuses = Counter(finished(result.id, worker).status for result in results)
    assert statuses == {Status.SUCCESSFUL: 3, Status.FAILED: 1}


@pytest.mark.processes
@pytest.mark.parametrize(
    "task, exception, message",
    [
        (test_tasks.failing_task_value_error, ValueError, "This task failed due to ValueError"),
        (test_tasks.failing_task_system_exit, SystemExit, "This task failed due to SystemExit"),
        (
            test_tasks.failing_task_keyboard_interrupt,
            KeyboardInterrupt,
            "This task failed due to KeyboardInterrupt",
        ),
        (test_tasks.exit_task, SystemExit, "1"),
    ],
    ids=["ValueError", "SystemExit", "KeyboardInterrupt", "exit"],
)
def test_failing_task(task, exception, message, worker, broker):
    result = task.enqueue()
    refreshed(result, worker)

    assert result.status == Status.FAILED and result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert_timestamps(result)
    [error] = result.errors
    assert error.exception_class is exception
    assert error.traceback.endswith(f"{exception.__name__}: {message}\n"), error.traceback
    assert result.task == task
    assert result.args == [] and result.kwargs == {}
    assert result.attempts == 1
    # Run once (its Celery task delivered once), task_finished sent with the failure, and the
    # worker goes on: its next task runs.
    assert worker.received(result.id) == 1
    assert f"Task id={result.id} path={task.module_path} state=FAILED" in worker.log()
    assert finished(test_tasks.noop_task.enqueue().id, worker).status == Status.SUCCESSFUL


@pytest.mark.processes
def test_complex_exception(worker, broker):
    result = test_tasks.complex_exception.enqueue()
    refreshed(result, worker)

    assert result.status == Status.FAILED
    assert_timestamps(result)
    assert result._return_value is None
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback
    assert result.task == test_tasks.complex_exception
    assert result.attempts == 1


@pytest.mark.processes
def test_complex_return_value(worker, broker):
    result = test_tasks.complex_return_value.enqueue()
    refreshed(result, worker)

    assert result.status == Status.FAILED
    assert_timestamps(result)
    assert result._return_value is None
    assert result.errors[0].exception_class is TypeError
    assert "Unsupported type" in result.errors[0].traceback


@pytest.mark.processes
def test_return_values_are_normalised(worker, broker):
    normalised = test_tasks.return_normalisable.enqueue()
    decimal = test_tasks.return_decimal.enqueue()
    assert finished(normalised.id, worker).return_value == {
        "tuple": [1, 2],
        "bytes": "text",
        "nested": [{"a": [None, True, 1.5]}],
    }
    refused = finished(decimal.id, worker)
    assert refused.status == Status.FAILED and refused.errors[0].exception_class is TypeError


@pytest.mark.processes
def test_takes_context(worker, broker):
    result = test_tasks.get_task_id.enqueue()
    refreshed(result, worker)
    assert result.return_value == result.id


@pytest.mark.processes
def test_context(worker, broker):
    result = test_tasks.check_context.enqueue(1)
    refreshed(result, worker)
    assert result.status == Status.SUCCESSFUL, result.errors
    assert result.return_value == {"attempt": 1, "id": result.id}


@pytest.mark.processes
def test_started_finished_logs(worker, broker):
    """Django's receivers of task_started and task_finished log each once, in the worker."""
    result = test_tasks.noop_task.enqueue()
    failing = test_tasks.failing_task_value_error.enqueue()
    finished(result.id, worker)
    finished(failing.id, worker)
    log = worker.log()
    path = "tests.tasks.ported_tasks"
    assert log.count(f"Task id={result.id} ") == 2, log[-3000:]
    assert f"Task id={result.id} path={path}.noop_task state=RUNNING" in log
    assert f"Task id={result.id} path={path}.noop_task state=SUCCESSFUL" in log
    assert log.count(f"Task id={failing.id} ") == 2, log[-3000:]
    assert f"Task id={failing.id} path={path}.failing_task_value_error state=RUNNING" in log
    assert f"Task id={failing.id} path={path}.failing_task_value_error state=FAILED" in log


@pytest.mark.processes
def test_run_after(worker, broker):
    result = test_tasks.noop_task.using(run_after=timezone.now() + timedelta(hours=10)).enqueue()
    # A task sent after it runs: the delayed one was not sent.
    finished(test_tasks.noop_task.enqueue().id, worker)
    assert backend().get_result(result.id).status == Status.READY
    assert worker.received(result.id) == 0

    Job.objects.filter(pk=result.id).update(run_after=timezone.now())
    call_command("sweep_jobs", burst=True)
    refreshed(result, worker)
    assert result.status == Status.SUCCESSFUL
    assert result.started_at >= Job.objects.get(pk=result.id).run_after


@pytest.mark.processes
def test_doesnt_process_different_queue(worker, start_worker, broker):
    result = test_tasks.noop_task.using(queue_name="reports").enqueue()
    # The module's worker serves the default queue only: a later task of it runs, this one waits.
    finished(test_tasks.noop_task.enqueue().id, worker)
    assert backend().get_result(result.id).status == Status.READY
    assert queued_task_ids(broker, "reports") == [result.id]

    # The original's test_process_all_queues: a worker of several queues (Celery's default
    # queue, "celery", among them) takes it.
    every_queue = start_worker("ported-every-queue", "-Q", "celery,reports")
    refreshed(result, every_queue)
    assert result.status == Status.SUCCESSFUL
    assert (every_queue.received(result.id), worker.received(result.id)) == (1, 0)


@pytest.mark.processes
def test_task_jobs_naming_no_task_fail_without_running_anything(worker, broker, tmp_path):
    """The original's test_invalid_task_path, test_missing_task_path and test_task_import_string
    on a worker: the job fails, and what its payload names is never called."""
    touched = tmp_path / "touched"
    not_a_task = hand_made_task_job("subprocess.check_output", [["touch", str(touched)]])
    missing = hand_made_task_job("missing.func")
    import_error = hand_made_task_job("tests.tasks.ported_tasks.some_test")
    for job, error in [
        (not_a_task, "builtins.TypeError"),
        (missing, "builtins.ImportError"),
        (import_error, "builtins.ImportError"),
    ]:
        wait_for(
            lambda job=job: Job.objects.get(pk=job.pk).ended,
            timeout=60,
            interval=0.05,
            message=f"job {job.pk} to end:\n{worker.log(tail=3000)}",
        )
        assert Job.objects.get(pk=job.pk).state == Job.State.FAILED
        record = StageRecord.objects.get(job=job, stage=RUN_STAGE)
        assert record.error_class == error
        assert error.removeprefix("builtins.") in record.error_traceback
    assert not touched.exists()


@pytest.mark.processes
def test_exception_classes_pop_empty_list_bug(worker, broker):
    """A FAILED task whose failure has no recorded class still has one error (RQ's bug)."""
    result = test_tasks.failing_task_value_error.enqueue()
    finished(result.id, worker)
    StageRecord.objects.filter(job_id=result.id).update(error_class=None)
    task_result = backend().get_result(result.id)
    assert task_result.status == Status.FAILED
    assert task_result.task == test_tasks.failing_task_value_error
    assert task_result.errors[0].exception_class_path == "builtins.Exception"

    # Ended without any failure of its own: cancelled before it started.
    waiting = test_tasks.noop_task.using(queue_name="reports").enqueue()
    eventbus.cancel_job(waiting.id)
    cancelled = backend().get_result(waiting.id)
    assert cancelled.status == Status.FAILED and cancelled.is_finished
    assert [e.exception_class_path for e in cancelled.errors] == ["eventbus.jobtypes.JobCancelled"]


@pytest.mark.processes
def test_kill_a_pool_process_mid_task(worker, broker, tmp_path):
    """The original's test_kill: there the task stays RUNNING for good (its issue #46). Here the
    run is delivered again (reject_on_worker_lost) and the task's body runs again from its start:
    SUCCESSFUL, its attempts counting the dead one, a worker id each."""
    path, gate = tmp_path / "lines", tmp_path / "gate"
    result = test_tasks.wait_for_gate.enqueue(str(path), str(gate))
    started(path, worker)
    assert backend().get_result(result.id).status == Status.RUNNING
    [child] = worker.pool_pids()
    os.kill(child, signal.SIGKILL)
    gate.touch()

    refreshed(result, worker)
    assert result.status == Status.SUCCESSFUL
    assert result.return_value == 2
    assert lines(path) == ["start 1", "start 2", "done"]
    assert result.attempts == 2 and len(set(result.worker_ids)) == 2


@pytest.mark.processes
@pytest.mark.parametrize(
    "signum, exit_code",
    # Celery's exit codes: 1 after a Ctrl-C's warm shutdown (the original's db_worker exits 0).
    [(signal.SIGTERM, 0), (signal.SIGINT, 1)],
    ids=["SIGTERM", "SIGINT"],
)
def test_interrupt_signals(signum, exit_code, start_worker, broker, tmp_path):
    """A worker asked to stop (SIGTERM, or one Ctrl-C) finishes the task it runs, then exits."""
    path, gate = tmp_path / "lines", tmp_path / "gate"
    stopping = start_worker("ported-stopping", "-Q", "reports")
    result = test_tasks.wait_for_gate.using(queue_name="reports").enqueue(str(path), str(gate))
    started(path, stopping)
    assert backend().get_result(result.id).status == Status.RUNNING

    stopping.signal(signum)
    wait_for(lambda: "Warm shutdown" in stopping.log(), timeout=30, message="the warm shutdown")
    gate.touch()
    assert stopping.wait(timeout=30) == exit_code, stopping.log(tail=3000)
    refreshed(result, stopping)
    assert result.status == Status.SUCCESSFUL and result.attempts == 1


@pytest.mark.processes
def test_repeat_ctrl_c(start_worker, broker, tmp_path):
    """A second Ctrl-C (Celery's cold shutdown) ends the task mid-run. The original's db_worker
    then fails it (SystemExit); here the attempt is lost with its process, not failed, and the
    task runs again on the next worker of its queue: SUCCESSFUL, attempts 2."""
    path, gate = tmp_path / "lines", tmp_path / "gate"
    first = start_worker("ported-ctrl-c", "-Q", "reports")
    result = test_tasks.wait_for_gate.using(queue_name="reports").enqueue(str(path), str(gate))
    started(path, first)

    first.signal(signal.SIGINT)
    wait_for(lambda: "Warm shutdown" in first.log(), timeout=30, message="the warm shutdown")
    first.signal(signal.SIGINT)
    first.wait(timeout=30)
    stopped = backend().get_result(result.id)
    assert stopped.status == Status.RUNNING and stopped.errors == [], first.log(tail=3000)
    assert StageRecord.objects.get(job_id=result.id).error_class is None

    gate.touch()
    second = start_worker("ported-after-ctrl-c", "-Q", "reports")
    refreshed(result, first, second)
    assert result.status == Status.SUCCESSFUL and result.return_value == 2
    assert lines(path) == ["start 1", "start 2", "done"]
    assert result.attempts == 2 and len(set(result.worker_ids)) == 2


@pytest.mark.processes
def test_multiple_workers(worker, start_worker, broker, tmp_path):
    """Two workers of one queue: each task runs once, on one of them."""
    second = start_worker("ported-second")
    path = tmp_path / "lines"
    results = [test_tasks.append_line.enqueue(str(path), f"line {i}") for i in range(10)]
    for result in results:
        assert finished(result.id, worker, second).status == Status.SUCCESSFUL
    assert sorted(lines(path)) == sorted(f"line {i}" for i in range(10))
    for result in results:
        assert worker.received(result.id) + second.received(result.id) == 1
        assert backend().get_result(result.id).attempts == 1
