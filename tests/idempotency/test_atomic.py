"""The answer is stored in the view's own transaction: never a COMPLETED record without
the view's effects."""

import pytest
from django.db import connection
from django.test import Client

from eventbus.models import Job
from idempotency.models import IdempotencyRecord

from . import views

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.idempotency.urls")]


def post(client, path, key):
    return client.post(path, data="{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.fixture
def client(user):
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def test_rolled_back_view_leaves_no_completed_record_and_no_effect(client):
    assert post(client, "/t/atomic/?fail=1", "r").status_code == 500
    assert not Job.objects.filter(event_type="effect").exists()
    if connection.vendor == "postgresql":
        # The key was held by the rolled-back transaction: nothing of it is left.
        assert not IdempotencyRecord.objects.filter(key="r").exists()
    else:
        assert IdempotencyRecord.objects.get(key="r").state == "FAILED"
    assert post(client, "/t/atomic/?fail=1", "r").status_code == 500
    assert views.CALLS["atomic"] == 2  # the retry executed


def test_completed_record_commits_with_the_effect(client):
    first = post(client, "/t/atomic/", "ok")
    assert first.status_code == 201
    assert Job.objects.filter(event_type="effect").count() == 1
    assert IdempotencyRecord.objects.get(key="ok").state == "COMPLETED"
    assert post(client, "/t/atomic/", "ok")["Idempotent-Replayed"] == "true"
    assert Job.objects.filter(event_type="effect").count() == 1


@pytest.mark.parametrize("atomic_requests", [True, False])
def test_atomic_requests_puts_the_answer_in_the_view_transaction(
    client, monkeypatch, atomic_requests, durable_leases
):
    """With ATOMIC_REQUESTS an unmarked view's effects and its answer commit together: a
    lost lease rolls the effects back. Without it, the effects stand and the answer is
    simply not stored."""
    from django.db import connection

    from idempotency.stores.db import DatabaseStore

    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", atomic_requests)
    monkeypatch.setattr(DatabaseStore, "complete", lambda self, lease, response: False)
    response = post(client, "/t/plain-effect/", "ar")
    effects = Job.objects.filter(event_type="effect").count()
    if atomic_requests:
        assert response.status_code == 409 and effects == 0
    else:
        assert response.status_code == 201 and effects == 1


def test_the_commit_decides(client, monkeypatch, durable_leases):
    """If the store cannot complete inside the transaction (lease lost), the view's
    effects roll back and the client is told so."""
    from idempotency.stores.db import DatabaseStore

    monkeypatch.setattr(DatabaseStore, "complete", lambda self, lease, response: False)
    response = post(client, "/t/atomic/", "lost")
    assert response.status_code == 409
    assert response.json()["type"] == "urn:problem:idempotency-lease-lost"
    assert not Job.objects.filter(event_type="effect").exists()
