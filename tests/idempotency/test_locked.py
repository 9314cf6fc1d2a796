"""On PostgreSQL an atomic view holds its key by a lock of its own transaction and stores its
answer with one INSERT in it (DatabaseStore.claim / record_answer): races with real threads."""

import contextlib
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import RequestFactory
from psycopg.pq import TransactionStatus

from eventbus.models import Job
from idempotency.adapters import django as django_adapter
from idempotency.fingerprint import request_fingerprint
from idempotency.models import IdempotencyRecord
from idempotency.responses import StoredResponse
from idempotency.stores.db import DatabaseStore

from . import views
from .test_concurrency import StalledRequest, in_threads, post_as

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.idempotency.urls"),
    pytest.mark.postgres,  # the transaction's lock is PostgreSQL's
]
GATED = "/t/atomic/?gate=g"


def effects():
    return Job.objects.filter(event_type="effect").count()


def fingerprint_of(path):
    """The fingerprint of post_as(user, path, key)."""
    return request_fingerprint(RequestFactory().post(path, data="{}", content_type="application/json"))


def test_concurrent_requests_with_one_key_execute_once(user):
    results = in_threads(20, lambda _: post_as(user, "/t/atomic/", "race"))
    statuses = sorted(r.status_code for r in results)
    assert set(statuses) <= {201, 409}, statuses
    originals = [r for r in results if r.status_code == 201 and not r.has_header("Idempotent-Replayed")]
    assert len(originals) == 1
    assert all(r.content == originals[0].content for r in results if r.status_code == 201)
    assert all(int(r["Retry-After"]) >= 1 for r in results if r.status_code == 409)
    assert views.CALLS["atomic"] == 1 and effects() == 1
    assert post_as(user, "/t/atomic/", "race")["Idempotent-Replayed"] == "true"
    assert effects() == 1


def test_no_record_while_an_atomic_view_runs_and_a_second_request_gets_409(user):
    stalled = StalledRequest(user, GATED, "held", "atomic")
    assert not IdempotencyRecord.objects.filter(key="held").exists()  # the lock is the transaction's
    busy = post_as(user, GATED, "held")
    assert busy.status_code == 409 and int(busy["Retry-After"]) >= 1
    assert busy.json()["type"] == "urn:problem:idempotency-in-progress"
    assert stalled.release().status_code == 201
    assert IdempotencyRecord.objects.get(key="held").state == "COMPLETED"
    assert views.CALLS["atomic"] == 1


def test_a_view_that_is_not_atomic_keeps_its_durable_lease(user):
    stalled = StalledRequest(user, "/t/gated/?gate=g", "durable", "gated")
    record = IdempotencyRecord.objects.get(key="durable")
    assert record.state == "PENDING" and record.lease_token
    assert stalled.release().status_code == 201
    assert IdempotencyRecord.objects.get(key="durable").state == "COMPLETED"


def test_a_crash_mid_view_stores_nothing_and_the_retry_runs_once(user):
    with pytest.raises(RuntimeError, match="fails after its effect"):
        post_as(user, "/t/atomic/?fail=1", "crash")
    assert not IdempotencyRecord.objects.filter(key="crash").exists() and effects() == 0
    # The key stays free, fingerprint included: there were no effects to protect.
    retry = post_as(user, "/t/atomic/", "crash")
    assert retry.status_code == 201 and retry.json()["n"] == 2
    assert post_as(user, "/t/atomic/", "crash")["Idempotent-Replayed"] == "true"
    assert effects() == 1 and views.CALLS["atomic"] == 2


def test_another_body_under_a_stored_key_is_422(user):
    assert post_as(user, "/t/atomic/", "mm").status_code == 201
    other = post_as(user, "/t/atomic/?other=1", "mm")
    assert other.status_code == 422
    assert other.json()["type"] == "urn:problem:idempotency-key-mismatch"
    assert effects() == 1


def test_a_5xx_answer_commits_its_effects_and_keeps_the_key_failed(user):
    assert post_as(user, "/t/atomic/?status=503", "five").status_code == 503
    assert IdempotencyRecord.objects.get(key="five").state == "FAILED" and effects() == 1
    assert post_as(user, "/t/atomic/?status=503&x=1", "five").status_code == 422  # effects may exist
    assert post_as(user, "/t/atomic/?status=503", "five").status_code == 503  # the same request runs again
    assert views.CALLS["atomic"] == 2


def test_a_refusal_stores_nothing(user):
    assert post_as(user, "/t/atomic/?status=400", "no").status_code == 400
    assert not IdempotencyRecord.objects.filter(key="no").exists()
    assert post_as(user, "/t/atomic/", "no").status_code == 201  # another request may use the key


def test_a_record_stored_meanwhile_wins_and_the_view_rolls_back(user):
    """The UNIQUE constraint arbitrates: a record another writer committed while the view ran
    (here, directly) makes the view's INSERT a no-op; the view rolls back and the client gets
    what that record says."""
    stalled = StalledRequest(user, GATED, "won", "atomic")
    IdempotencyRecord.objects.create(
        scope=f"-:{user.pk}",
        key="won",
        fingerprint=fingerprint_of(GATED),
        state="COMPLETED",
        response_status=201,
        response_headers=[["Content-Type", "application/json"]],
        response_body=b'{"n": 0}',
        expires_at=DatabaseStore.now() + timedelta(hours=1),
    )
    lost = stalled.release()
    assert lost.status_code == 201 and lost["Idempotent-Replayed"] == "true"
    assert lost.content == b'{"n": 0}'
    assert effects() == 0  # the view ran, and rolled back


def test_a_durable_lease_taken_meanwhile_wins_and_the_view_rolls_back(user):
    stalled = StalledRequest(user, GATED, "leased", "atomic")
    taken = DatabaseStore().acquire(
        scope=f"-:{user.pk}",
        key="leased",
        fingerprint=fingerprint_of(GATED),
        lease_seconds=60,
        ttl_seconds=3600,
    )
    assert taken.lease is not None
    lost = stalled.release()
    assert lost.status_code == 409 and lost.json()["type"] == "urn:problem:idempotency-in-progress"
    assert effects() == 0
    assert IdempotencyRecord.objects.get(key="leased").lease_token == taken.lease.token


def seen_by_another_connection(key):
    """Whether a committed record of `key` is visible outside this thread's transaction."""
    return in_threads(1, lambda _: IdempotencyRecord.objects.filter(key=key).exists())[0]


def claimed(store, key):
    acquisition = store.claim(
        scope="-:0", key=key, fingerprint="f", ttl_seconds=60, method="POST", path="/", using="default"
    )
    assert acquisition.claim is not None
    return acquisition.claim


ANSWER = StoredResponse(201, (("Content-Type", "application/json"),), b"{}")


@pytest.mark.skipif(
    not django_adapter.INTERNALS,
    reason="idempotency.adapters.django is on its public-API fallback (ends_transaction is False): "
    "the answer commits with Django's own COMMIT, one round trip more (test_adapters tests it)",
)
def test_the_last_statement_of_the_transaction_commits_it_with_the_answer():
    """One round trip fewer: the INSERT carries the COMMIT, so the answer is committed before
    Django's atomic block exits (and psycopg's commit then finds nothing to do)."""
    store = DatabaseStore()
    with transaction.atomic():
        assert store.record_answer(claimed(store, "folded"), ANSWER, last=True)
        assert seen_by_another_connection("folded")
        assert connection.connection.pgconn.transaction_status == TransactionStatus.IDLE
    assert IdempotencyRecord.objects.get(key="folded").state == "COMPLETED"


@pytest.mark.parametrize("case", ["not last", "nested"])
def test_the_answer_commits_with_the_transaction_when_it_may_not_end_it(case):
    """Not the last statement, or inside an atomic block of the caller's: Django's own COMMIT
    (of the outermost block) commits the answer, as the work's other statements."""
    store = DatabaseStore()
    with transaction.atomic():
        inner = transaction.atomic() if case != "not last" else contextlib.nullcontext()
        with inner:
            assert store.record_answer(claimed(store, "kept"), ANSWER, last=case != "not last")
        assert not seen_by_another_connection("kept")
    assert IdempotencyRecord.objects.get(key="kept").state == "COMPLETED"


def test_a_lost_insert_does_not_commit_the_work_it_was_sent_with():
    store = DatabaseStore()
    held = claimed(store, "taken")
    IdempotencyRecord.objects.create(
        scope="-:0", key="taken", fingerprint="f", expires_at=held.lease.expires_at
    )
    with pytest.raises(RuntimeError), transaction.atomic():
        Job.objects.create(scope="-:0", idem_key="taken", domain="d", event_type="effect")
        assert not store.record_answer(held, ANSWER, last=True)
        raise RuntimeError("the caller rolls back")
    assert effects() == 0
