"""The job's move from idempotency (Operation) to the event bus (Job) keeps a database's data:
migrated back to before the move, a job with stage records and a retry is made there (as the
old code made it), then migrated forward: the same rows under the new names, the same ids, and
the permissions users and groups had on operations now on jobs; and back again. On SQLite and
PostgreSQL alike (DATABASE_URL). Without the event bus, idempotency's migrations run alone and
leave no empty table behind, and the event bus can still be installed later.
"""

import os
import sqlite3
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from tests.processes import BASE_DIR

BEFORE = [("idempotency", "0002_operation_retry_of_and_cancel"), ("eventbus", "0004_deadletter")]
AFTER = [("idempotency", "0003_job_moves_to_eventbus"), ("eventbus", "0007_job_permissions")]


def migrate(targets):
    """Migrate the test database to `targets`; the historical models of what is applied then."""
    MigrationExecutor(connection).migrate(targets)
    ContentType.objects.clear_cache()
    return MigrationExecutor(connection)._create_project_state(with_applied_migrations=True).apps


@pytest.fixture
def migrated_back():
    """The database before the move, migrated forward to the latest again whatever the test does."""
    apps = migrate(BEFORE)
    try:
        yield apps
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def tables():
    with connection.cursor() as cursor:
        return set(connection.introspection.table_names(cursor))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("job_permissions", ["absent", "present"])
def test_the_move_keeps_jobs_stage_records_retries_and_permissions(migrated_back, job_permissions):
    apps = migrated_back
    assert "idempotency_operation" in tables() and "eventbus_job" not in tables()
    User = apps.get_model("auth", "User")
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    Operation = apps.get_model("idempotency", "Operation")
    StageRecord = apps.get_model("eventbus", "StageRecord")
    ContentTypes = apps.get_model("contenttypes", "ContentType")

    owner = User.objects.create(username="alice")
    viewer = User.objects.create(username="auditor")
    operators = Group.objects.create(name="operators")
    # Migrated back, the test database's job permissions are the operation's again.
    operation_type = ContentTypes.objects.get(app_label="idempotency", model="operation")
    viewer.user_permissions.add(
        Permission.objects.get(content_type=operation_type, codename="view_operation")
    )
    operators.permissions.add(
        Permission.objects.get(content_type=operation_type, codename="change_operation")
    )
    if job_permissions == "present":
        # A migrate that stopped after 0005 let post_migrate create the job's own content type.
        job_type = ContentTypes.objects.create(app_label="eventbus", model="job")
        for action in ("add", "change", "delete", "view"):
            Permission.objects.create(
                content_type=job_type, codename=f"{action}_job", name=f"Can {action} job"
            )

    failed = Operation.objects.create(
        scope=f"-:{owner.pk}",
        idem_key="order-1",
        owner=owner,
        domain="staged",
        event_type="job.requested",
        state="FAILED",
        payload={"order": 1},
        completed_at=timezone.now(),
    )
    retry = Operation.objects.create(
        scope=f"-:{owner.pk}",
        idem_key="retry-1",
        owner=owner,
        domain="staged",
        event_type="job.retried",
        payload={"order": 1},
        retry_of=failed,
    )
    first = StageRecord.objects.create(
        operation=failed, stage="first", attempts=1, finished_at=timezone.now()
    )
    second = StageRecord.objects.create(operation=failed, stage="second", attempts=2, error_type="ValueError")
    reused = StageRecord.objects.create(
        operation=retry, stage="first", attempts=1, finished_at=timezone.now()
    )

    apps = migrate(AFTER)
    assert "eventbus_job" in tables() and "idempotency_operation" not in tables()
    Job = apps.get_model("eventbus", "Job")
    StageRecord = apps.get_model("eventbus", "StageRecord")
    assert {job.id: (job.state, job.retry_of_id, job.owner_id) for job in Job.objects.all()} == {
        failed.pk: ("FAILED", None, owner.pk),
        retry.pk: ("PENDING", failed.pk, owner.pk),
    }
    assert Job.objects.get(pk=failed.pk).payload == {"order": 1}
    assert {r.pk: (r.job_id, r.stage, r.attempts) for r in StageRecord.objects.all()} == {
        first.pk: (failed.pk, "first", 1),
        second.pk: (failed.pk, "second", 2),
        reused.pk: (retry.pk, "first", 1),
    }
    assert list(Job.objects.get(pk=retry.pk).retries.all()) == []
    assert [job.pk for job in Job.objects.get(pk=failed.pk).retries.all()] == [retry.pk]
    # The UNIQUE constraints hold under their new names.
    with pytest.raises(IntegrityError), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO eventbus_stagerecord (job_id, stage, attempts, events, started_at) "
            "VALUES (%s, 'first', 0, '[]', %s)",
            [Job._meta.pk.get_db_prep_value(failed.pk, connection), timezone.now()],
        )

    # The users' and groups' permissions, on the models the code has now.
    from django.contrib.auth.models import User as CurrentUser

    assert CurrentUser.objects.get(pk=viewer.pk).has_perm("eventbus.view_job")
    member = CurrentUser.objects.create(username="member")
    member.groups.add(operators.pk)
    assert CurrentUser.objects.get(pk=member.pk).has_perm("eventbus.change_job")

    # And back: the table and the names as they were, the rows too.
    apps = migrate(BEFORE)
    assert "idempotency_operation" in tables() and "eventbus_job" not in tables()
    Operation = apps.get_model("idempotency", "Operation")
    StageRecord = apps.get_model("eventbus", "StageRecord")
    assert Operation.objects.get(pk=retry.pk).retry_of_id == failed.pk
    assert StageRecord.objects.filter(operation_id=failed.pk).count() == 2


@pytest.mark.processes
@pytest.mark.skipif(connection.vendor != "sqlite", reason="a SQLite file of its own; run once")
def test_idempotency_migrates_alone_and_the_event_bus_can_come_later(tmp_path):
    """A project with idempotency and without the event bus: its 0003 drops the empty table
    nothing owns any more, and keeps one that holds rows; migrated back to 0002 (the table made
    again if it was dropped), the event bus installed then takes the table and its rows over."""
    database = tmp_path / "alone.sqlite3"
    for name, apps in (
        ("alone", "[a for a in INSTALLED_APPS if a not in ('eventbus', 'gateway', 'config')]"),
        ("full", "INSTALLED_APPS"),
    ):
        (tmp_path / f"{name}_settings.py").write_text(
            "from config.settings.test import *  # noqa\n"
            f"INSTALLED_APPS = {apps}\n"
            f"DATABASES = {{'default': {{'ENGINE': 'django.db.backends.sqlite3', 'NAME': {str(database)!r}}}}}\n"
        )

    def manage(settings, *args):
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": f"{settings}_settings",
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(BASE_DIR)]),
        }
        command = [sys.executable, "-m", "django", *args, "--skip-checks"]
        done = subprocess.run(command, cwd=BASE_DIR, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done

    def tables_there():
        with sqlite3.connect(database) as db:
            return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    manage("alone", "migrate", "idempotency")
    assert "idempotency_idempotencyrecord" in tables_there()
    assert "idempotency_operation" not in tables_there()
    manage("alone", "migrate", "idempotency", "0002")
    assert "idempotency_operation" in tables_there()
    job_id = uuid.uuid4()
    with sqlite3.connect(database) as db:
        db.execute(
            "INSERT INTO idempotency_operation (op_id, scope, idem_key, domain, event_type, biz_key, state, "
            "payload, accepted_at) VALUES (?, '-:1', 'k', 'scan', 'job.requested', '', 'PENDING', '{}', "
            "'2026-01-01 00:00:00')",
            [job_id.hex],
        )
    done = manage("alone", "migrate", "idempotency")
    assert "idempotency_operation" in tables_there() and "holds rows" in done.stderr  # kept: it has a row
    manage("alone", "migrate", "idempotency", "0002")
    manage("full", "migrate")
    assert "idempotency_operation" not in tables_there()
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT id, idem_key FROM eventbus_job").fetchall() == [(job_id.hex, "k")]


@pytest.mark.django_db(transaction=True)
def test_one_retry_per_job_keeps_the_oldest_retrys_link_of_a_job_retried_twice():
    """0008 on a database holding a job retried twice (before the constraint): the oldest retry
    keeps its link, the later one is unlinked (the job stays), and no second retry goes in after."""
    apps = migrate([("eventbus", "0007_job_permissions")])
    try:
        Job = apps.get_model("eventbus", "Job")
        now = timezone.now()

        def job(key, **fields):
            return Job.objects.create(
                scope="-:1", idem_key=key, domain="scan", event_type="job.requested", **fields
            )

        old = job("old", state="FAILED", accepted_at=now)
        later = job("later", retry_of=old, accepted_at=now + timedelta(seconds=2))
        oldest = job("oldest", retry_of=old, accepted_at=now + timedelta(seconds=1))
        other = job("other", state="FAILED", accepted_at=now)
        once = job("once", retry_of=other, accepted_at=now)

        apps = migrate([("eventbus", "0008_job_one_retry")])
        Job = apps.get_model("eventbus", "Job")
        assert Job.objects.get(pk=oldest.pk).retry_of_id == old.pk
        assert Job.objects.get(pk=later.pk).retry_of_id is None
        assert Job.objects.get(pk=once.pk).retry_of_id == other.pk
        with pytest.raises(IntegrityError):
            Job.objects.create(
                scope="-:1", idem_key="third", domain="scan", event_type="x", retry_of_id=old.pk
            )
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
