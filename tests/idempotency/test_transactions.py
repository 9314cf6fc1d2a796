"""The toolkit's transactions on SQLite as a new project configures it (DEFERRED, Django's
default): a keyed request's, and a cleanup_jobs batch's, take the write lock first, so that
concurrent writers wait for it instead of failing "database is locked" (idempotency.transactions);
and the check idempotency.W002 that asks such a project for IMMEDIATE transactions. Real threads
on the suite's file database; on PostgreSQL the same tests show nothing changes there."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.utils import ConnectionHandler
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from eventbus.models import Job
from idempotency.checks import check_sqlite_transaction_mode, deferred_sqlite_warnings
from idempotency.transactions import defers_write_lock, write_transaction
from tests.threads import in_threads

USERS, REQUESTS_EACH = 4, 5


@pytest.fixture
def deferred_transactions(monkeypatch):
    """The database as `startproject` leaves it: no OPTIONS, so DEFERRED transactions and the
    default 5 s timeout (the suite's settings make them IMMEDIATE), on every connection the test
    opens, the main thread's included. PostgreSQL is left as it is."""
    if connection.vendor != "sqlite":
        yield
        return
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {})
    yield
    connection.close()  # the next test's connection has the suite's OPTIONS again


@pytest.mark.django_db(transaction=True)
def test_20_concurrent_job_creations_of_4_users_on_deferred_sqlite_all_succeed(
    django_user_model, deferred_transactions
):
    tokens = [
        Token.objects.create(user=django_user_model.objects.create_user(f"user{n}")).key for n in range(USERS)
    ]

    def post(i):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {tokens[i % USERS]}")
        body = {"domain": "scan", "payload": {"image": f"{i}.png"}}
        response = client.post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY=f"job-{i}")
        return response.status_code, response.content

    results = in_threads(USERS * REQUESTS_EACH, post)

    assert [status for status, _ in results] == [201] * (USERS * REQUESTS_EACH), results
    assert Job.objects.count() == USERS * REQUESTS_EACH


def statements(work) -> list[str]:
    """The SQL `work` sends inside a new transaction on the default database."""
    with CaptureQueriesContext(connection) as captured:
        work()
    return [query["sql"] for query in captured.captured_queries]


def atomic():
    with transaction.atomic():
        pass


def locked():
    with write_transaction():
        pass


@pytest.mark.django_db(transaction=True)
def test_as_the_suite_configures_its_database_it_is_transaction_atomic_alone():
    # IMMEDIATE on SQLite (config.settings.base); on the PostgreSQL leg, PostgreSQL.
    assert statements(locked) == statements(atomic)


@pytest.mark.django_db(transaction=True)
def test_on_deferred_sqlite_it_begins_with_a_write_that_changes_nothing(deferred_transactions):
    sent, plain = statements(locked), statements(atomic)
    if connection.vendor == "sqlite":
        assert len(sent) == len(plain) + 1
        assert sent[1].startswith("UPDATE") and sent[1].endswith("WHERE 0")
    else:
        assert sent == plain


@pytest.mark.django_db(transaction=True)
def test_inside_an_open_transaction_it_is_a_savepoint_only(deferred_transactions):
    with transaction.atomic(), CaptureQueriesContext(connection) as captured, write_transaction():
        pass
    assert not any(query["sql"].startswith("UPDATE") for query in captured.captured_queries)


def handler(**databases) -> ConnectionHandler:
    return ConnectionHandler({alias: {"NAME": "x", **options} for alias, options in databases.items()})


SQLITE = "django.db.backends.sqlite3"


def test_which_databases_defer_the_write_lock():
    databases = handler(
        default={"ENGINE": SQLITE},
        deferred={"ENGINE": SQLITE, "OPTIONS": {"transaction_mode": "DEFERRED", "timeout": 20}},
        immediate={"ENGINE": SQLITE, "OPTIONS": {"transaction_mode": "IMMEDIATE"}},
        exclusive={"ENGINE": SQLITE, "OPTIONS": {"transaction_mode": "exclusive"}},
        postgres={"ENGINE": "django.db.backends.postgresql"},
    )
    assert {alias: defers_write_lock(databases[alias]) for alias in databases} == {
        "default": True,  # as startproject leaves it
        "deferred": True,
        "immediate": False,
        "exclusive": False,
        "postgres": False,
    }


def test_the_check_warns_of_a_new_projects_sqlite_and_says_what_to_set():
    databases = handler(
        default={"ENGINE": SQLITE},
        tutorial={"ENGINE": SQLITE, "OPTIONS": {"transaction_mode": "IMMEDIATE"}},
        postgres={"ENGINE": "django.db.backends.postgresql"},
    )
    (warning,) = deferred_sqlite_warnings(databases)
    assert warning.id == "idempotency.W002"
    assert "DATABASES['default']" in warning.msg and "database is locked" in warning.msg
    assert "\"transaction_mode\": \"IMMEDIATE\" to DATABASES['default']['OPTIONS']" in warning.hint


def test_the_check_passes_the_suites_settings():
    # IMMEDIATE on SQLite (config.settings.base), or PostgreSQL.
    assert check_sqlite_transaction_mode() == []


@pytest.mark.django_db(transaction=True)
def test_cleanup_jobs_waits_for_a_concurrent_writer_on_deferred_sqlite(deferred_transactions):
    """Its batch's DELETE reads the jobs first (Django's cascade): on SQLite that transaction
    takes the write lock at its start, and waits while another connection holds it."""
    from eventbus.job.retention import delete_ended_jobs

    ended = Job.objects.create(
        scope="-:1",
        idem_key="ended",
        domain="scan",
        event_type="job.requested",
        state=Job.State.COMPLETED,
        completed_at=timezone.now() - timedelta(days=60),
    )
    held, release = threading.Event(), threading.Event()

    def writer():
        try:
            with transaction.atomic():
                Job.objects.create(scope="-:1", idem_key="live", domain="scan", event_type="job.requested")
                held.set()
                release.wait(30)
        finally:
            connection.close()

    def release_once_writing(execute, sql, params, many, context):
        # The lock is let go while the cleanup's first write is under way (waiting for it).
        if sql.lstrip().upper().startswith(("UPDATE", "DELETE")) and not release.is_set():
            threading.Timer(0.3, release.set).start()
        return execute(sql, params, many, context)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert held.wait(30)
        with connection.execute_wrapper(release_once_writing):
            deleted = delete_ended_jobs(older_than=timedelta(days=30))
    finally:
        release.set()
        thread.join()
    assert deleted.jobs == 1
    assert not Job.objects.filter(pk=ended.pk).exists()
