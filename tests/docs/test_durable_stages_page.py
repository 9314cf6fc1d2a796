"""docs/howto/durable-stages.md's examples, run as the page writes them, on real processes.

The page's Python blocks become the `shop` app of a project of their own (each written by
tests/docs/blocks.py, as the import check writes it, with a `jobs` module that imports them), and a
Celery worker and a sweeper (`sweep_jobs`) run it on this run's Redis and test database. The
examples are called by a Django process of that project (`Project.run`), and this process reads
the jobs, their stage records and their signals from the database. Each example does what the
page says it does: an atomic stage credits once; a sleep waits WAITING and reminds once when due;
a cancel ends it at once; the first manager's approval wakes the request and is taken once, a
second manager's is refused, a rejection sent after it is kept and never taken, a decision sent
before the wait is taken without one; a campaign's children each credit once and its fan-in counts
them; a welcome credit starts when due, once per customer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from eventbus.models import Job, JobSignal, StageRecord
from tests.docs import blocks
from tests.eventbus.helpers import wait_for_job_state
from tests.processes import Manage, Worker, process_env, wait_for

PAGE = blocks.DOCS / "howto" / "durable-stages.md"
State = Job.State
# Seconds a sleep and a delayed start last: long enough to see the job WAITING (or PENDING) first.
SLEEP = 4
# What the project's Django process prints before its result.
RESULT = "RESULT "


def page_blocks() -> dict[str, blocks.Block]:
    """The page's Python blocks by the module each is written as (`shop.credits`...)."""
    return {block.option("module"): block for block in blocks.blocks_of(PAGE) if block.kind == "python"}


def test_the_shop_app_of_every_page_has_the_models_this_page_shows():
    """The other pages' blocks are checked against tests/docs/blocks.py's `shop` app: its models
    are this page's, to the character."""
    assert blocks.SHOP_APP["models.py"] == page_blocks()["shop.models"].body


@dataclass
class Project:
    """The page's project: its folder, the environment of its processes, its worker and sweeper."""

    root: Path
    env: dict[str, str]
    worker: Worker
    sweeper: Manage

    def run(self, code: str, **values: Any) -> Any:
        """Run `code` in a Django process of the project, `values` among its names; returns what
        it assigns to `result` (as JSON gives it back)."""
        script = (
            "import json, sys\nimport django\n\ndjango.setup()\n"
            "globals().update(json.loads(sys.argv[1]))\n"
            f"{textwrap.dedent(code)}\n"
            f"print({RESULT!r} + json.dumps(result, default=str))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, json.dumps(values, default=str)],
            cwd=self.root,
            env=process_env(**self.env),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{code}\n{done.stdout}\n{done.stderr}"
        [line] = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
        return json.loads(line[len(RESULT) :])

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}:\n{p.log(tail=6000)}" for p in (self.worker, self.sweeper))

    def mails(self) -> list[str]:
        """The e-mails the worker sent (Django's file backend: one file per connection)."""
        folder = self.root / "mail"
        return [path.read_text() for path in sorted(folder.iterdir())] if folder.exists() else []


@pytest.fixture(scope="module")
def project(redis_url, django_db_setup, tmp_path_factory):
    root = tmp_path_factory.mktemp("durable-stages")
    modules = page_blocks()
    for block in modules.values():
        blocks.write_project(root, block)
    jobs = [name.split(".", 1)[1] for name in modules if name != "shop.models"]
    # The app's `jobs` module, which the event bus imports at startup: it registers the page's types.
    (root / "shop" / "jobs.py").write_text(f"from . import {', '.join(jobs)}  # noqa: F401\n")
    with (root / "docsproject" / "settings.py").open("a") as settings:
        settings.write(
            'EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"\n'
            f"EMAIL_FILE_PATH = {str(root / 'mail')!r}\n"
        )
    env = {
        "DJANGO_SETTINGS_MODULE": "docsproject.settings",
        "PYTHONPATH": os.pathsep.join([str(root), str(blocks.BASE_DIR)]),
    }
    project = Project(root, env, Worker("docs-durable", **env), Manage("sweep_jobs", **env))
    # The shop's tables, in this run's test database (the app has no migrations).
    project.run(
        "from django.core.management import call_command\ncall_command('migrate', run_syncdb=True, verbosity=0)\nresult = None"
    )
    try:
        project.worker.start(wait=False)
        project.sweeper.start()
        wait_for(project.worker.ready, timeout=60, message=f"the worker ready:\n{project.worker.log()}")
        yield project
    finally:
        for process in (project.worker, project.sweeper):
            process.stop()
            process.log_path.unlink(missing_ok=True)
        project.run(
            """
            from django.db import connection
            from shop.models import Credit, Customer

            with connection.schema_editor() as editor:
                editor.delete_model(Credit)
                editor.delete_model(Customer)
            result = None
            """
        )


def wait_for_state(job_id, state: str, project: Project, timeout: float = 60) -> Job:
    return wait_for_job_state(job_id, state, project.logs, timeout=timeout)


def result_of(job_id, stage: str):
    return StageRecord.objects.get(job_id=job_id, stage=stage).result


# What the project's process reads of the shop: a customer's balance and the credits of a job.
SHOP = """
from shop.models import Credit, Customer

result = {
    "balance": Customer.objects.get(pk=customer).credit_cents,
    "credits": list(Credit.objects.filter(customer_id=customer).values_list("amount_cents", flat=True)),
}
"""


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_an_atomic_stage_credits_the_customer_once(project):
    started = project.run(
        """
        from eventbus import start_job
        from shop.models import Customer

        customer = Customer.objects.create(name="ann", email="ann@example.com")
        job, _ = start_job("goodwill_credit", {"customer": customer.pk, "amount_cents": 500}, key=f"goodwill-{customer.pk}", owner=None)
        result = {"customer": customer.pk, "job": str(job.id)}
        """
    )
    wait_for_state(started["job"], State.COMPLETED, project)
    assert project.run(SHOP, customer=started["customer"]) == {"balance": 500, "credits": [500]}
    grant = StageRecord.objects.get(job_id=started["job"], stage="grant")
    assert grant.attempts == 1 and set(grant.result) == {"credit"}


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_sleep_waits_without_a_worker_and_its_reminder_goes_once_when_due(project):
    # The worker paused while the job is started: eventbus.tasks.enqueue records the job enqueued
    # after it sent the run, and a run that reached its sleep before that record would leave the
    # job marked enqueued, which the sweeper's due starts skip (the recovery sends it instead,
    # RECOVER_AFTER later).
    project.worker.pause()
    try:
        started = project.run(
            """
            from eventbus import start_job
            from shop.models import Customer

            customer = Customer.objects.create(name="bob", email="bob@example.com", credit_cents=1250)
            job, _ = start_job("credit_reminder", {"customer": customer.pk, "days": days}, key=f"remind-{customer.pk}", owner=None)
            result = {"customer": customer.pk, "job": str(job.id)}
            """,
            days=SLEEP / 86400,
        )
    finally:
        project.worker.resume()
    job = wait_for_state(started["job"], State.WAITING, project)
    wait = StageRecord.objects.get(job=job, stage="wait")
    due = parse_datetime(wait.waits["sleep:1"])
    assert (wait.waiting_for, job.run_after) == ("sleep", due)
    assert not StageRecord.objects.filter(job=job, stage="remind").exists()

    job = wait_for_state(job.id, State.COMPLETED, project)
    assert job.completed_at >= due
    assert result_of(job.id, "remind") == {"reminded": True}
    assert StageRecord.objects.get(job=job, stage="wait").attempts == 1, "a resumption is no attempt"
    sent = [mail for mail in project.mails() if "Subject: Your credit" in mail]
    assert (
        len(sent) == 1 and "12.50 of credit is waiting for you." in sent[0] and "bob@example.com" in sent[0]
    )


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_cancel_ends_a_sleep_at_once(project):
    started = project.run(
        """
        from eventbus import start_job
        from shop.models import Customer

        customer = Customer.objects.create(name="cy", email="cy@example.com", credit_cents=100)
        job, _ = start_job("credit_reminder", {"customer": customer.pk}, key=f"remind-{customer.pk}", owner=None)
        result = str(job.id)
        """
    )
    job = wait_for_state(started, State.WAITING, project)
    assert job.run_after > timezone.now() + timedelta(days=29), "30 days by default"
    assert (
        project.run("from eventbus import cancel_job\nresult = cancel_job(job).state", job=started)
        == "CANCELLED"
    )
    job.refresh_from_db()
    assert job.state == State.CANCELLED
    assert StageRecord.objects.get(job=job, stage="wait").state == "CANCELLED"


# The decisions, sent in one transaction: the job wakes once they are all sent (each signal wakes
# it once its transaction commits), so that a rejection sent after an approval finds it unended.
DECIDE = """
from django.contrib.auth import get_user_model
from django.db import transaction
from shop.decisions import decide

users = get_user_model().objects
with transaction.atomic():
    result = [decide(job, decision, users.get(username=name)) for decision, name in decisions]
"""


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_the_first_approval_wakes_the_request_a_second_managers_is_refused(project, django_user_model):
    for name in ("ann", "bob"):
        django_user_model.objects.create_user(name, password="x")
    started = project.run(
        """
        from eventbus import start_job
        from shop.models import Customer

        customer = Customer.objects.create(name="dee", email="dee@example.com")
        job, _ = start_job("credit_request", {"customer": customer.pk, "amount_cents": 2500}, key=f"request-{customer.pk}", owner=None)
        result = {"customer": customer.pk, "job": str(job.id)}
        """
    )
    job = wait_for_state(started["job"], State.WAITING, project)
    review = StageRecord.objects.get(job=job, stage="review")
    assert review.waiting_for == "signal:approve,reject"
    assert job.run_after == parse_datetime(review.waits["signal:approve,reject"]), "the timeout's end"
    assert job.run_after > timezone.now() + timedelta(days=2, hours=23)

    # Ann approves, twice (one signal), Bob approves (refused), Bob rejects (kept, never taken).
    decisions = [("approve", "ann"), ("approve", "ann"), ("approve", "bob"), ("reject", "bob")]
    assert project.run(DECIDE, job=job.id, decisions=decisions) == [True, True, False, True]
    job = wait_for_state(job.id, State.COMPLETED, project)
    assert result_of(job.id, "review") == {"approved": True, "by": "ann"}
    assert project.run(SHOP, customer=started["customer"]) == {"balance": 2500, "credits": [2500]}
    signals = {s.name: s for s in JobSignal.objects.filter(job=job)}
    assert signals["approve"].delivered_at is not None and signals["approve"].sent_by.username == "ann"
    assert signals["reject"].delivered_at is None
    assert StageRecord.objects.get(job=job, stage="review").attempts == 1


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_decision_sent_before_the_wait_is_kept_and_taken_without_one(project, django_user_model):
    django_user_model.objects.create_user("ann", password="x")
    started = project.run(
        """
        from datetime import timedelta

        from eventbus import start_job
        from shop.models import Customer

        customer = Customer.objects.create(name="eve", email="eve@example.com")
        job, _ = start_job(
            "credit_request", {"customer": customer.pk, "amount_cents": 900}, key=f"request-{customer.pk}",
            owner=None, run_after=timedelta(seconds=delay),
        )
        result = {"customer": customer.pk, "job": str(job.id), "state": job.state}
        """,
        delay=SLEEP,
    )
    assert started["state"] == State.PENDING
    assert project.run(DECIDE, job=started["job"], decisions=[("reject", "ann")]) == [True]
    job = wait_for_state(started["job"], State.COMPLETED, project)
    review = StageRecord.objects.get(job=job, stage="review")
    rejection = JobSignal.objects.get(job=job, name="reject")
    assert rejection.sent_at < review.started_at and rejection.delivered_at is not None
    assert review.result == {"approved": False, "by": "ann"} and review.attempts == 1
    assert result_of(job.id, "grant") == {"credit": None}
    assert project.run(SHOP, customer=started["customer"]) == {"balance": 0, "credits": []}
    assert project.run(DECIDE, job=job.id, decisions=[("approve", "ann")]) == [False], "the job has ended"
    assert not JobSignal.objects.filter(job=job, name="approve").exists()


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_campaign_credits_each_customer_once_through_its_children(project):
    started = project.run(
        """
        from eventbus import start_job
        from shop.models import Credit, Customer

        Credit.objects.all().delete()
        Customer.objects.all().delete()  # the customers of the tests before, and their credit
        credited = Customer.objects.create(name="has credit", credit_cents=100)
        customers = [Customer.objects.create(name=f"c{i}").pk for i in range(3)]
        job, _ = start_job("goodwill_campaign", {"amount_cents": 300}, key="campaign-1", owner=None)
        result = {"customers": customers, "credited": credited.pk, "job": str(job.id)}
        """
    )
    job = wait_for_state(started["job"], State.COMPLETED, project)
    assert result_of(job.id, "select") == {"customers": started["customers"]}
    children = list(Job.objects.filter(parent=job).order_by("accepted_at"))
    assert [(c.domain, c.state) for c in children] == [("goodwill_credit", State.COMPLETED)] * 3
    assert [c.payload["customer"] for c in children] == started["customers"]
    credit = StageRecord.objects.get(job=job, stage="credit")
    assert credit.result == {"credited": 3, "not_credited": []}
    assert sorted(credit.waits.values()) == sorted(str(c.id) for c in children)
    assert credit.attempts == 1, "resumed once the children ended: no second attempt"
    for customer in started["customers"]:
        assert project.run(SHOP, customer=customer) == {"balance": 300, "credits": [300]}
    assert project.run(SHOP, customer=started["credited"]) == {"balance": 100, "credits": []}


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_welcome_credit_starts_when_due_and_once_per_customer(project):
    started = project.run(
        """
        from datetime import timedelta

        from shop.models import Customer
        from shop.welcome import welcome_credit

        customer = Customer.objects.create(name="fay")
        first = welcome_credit(customer, after=timedelta(seconds=delay))
        again = welcome_credit(customer, after=timedelta(seconds=delay))
        result = {"customer": customer.pk, "jobs": [str(first.id), str(again.id)], "state": first.state}
        """,
        delay=SLEEP,
    )
    first, again = started["jobs"]
    assert first == again and started["state"] == State.PENDING
    job = Job.objects.get(pk=first)
    assert job.run_after is not None and job.started_at is None
    job = wait_for_state(first, State.COMPLETED, project)
    assert job.started_at >= job.run_after
    assert project.run(SHOP, customer=started["customer"]) == {"balance": 500, "credits": [500]}
