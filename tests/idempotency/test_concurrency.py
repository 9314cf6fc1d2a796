"""Races with real threads against the real database (run on PostgreSQL in CI)."""

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from eventbus.models import Job
from idempotency.models import IdempotencyRecord
from idempotency.services import accept_once
from tests.processes import wait_for
from tests.threads import in_threads

from . import views

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.idempotency.urls")]
THREADS = 50


def test_50_threads_post_one_key_one_execution(user):
    token = Token.objects.create(user=user)
    body = {"domain": "scan", "payload": {"image": "cat.png"}}

    def post(_):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        r = client.post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="race-1")
        return r.status_code, r.content, r.get("Retry-After"), r.get("Idempotent-Replayed")

    results = in_threads(THREADS, post)
    assert Job.objects.count() == 1
    created = [r for r in results if r[0] == 201]
    conflicts = [r for r in results if r[0] == 409]
    assert len(created) + len(conflicts) == THREADS, {r[0] for r in results}
    originals = [r for r in created if r[3] is None]
    assert len(originals) == 1  # one execution; every other 201 is a replay of it
    original_body = originals[0][1]
    assert all(r[1] == original_body for r in created)
    assert all(r[2] and int(r[2]) >= 1 for r in conflicts)
    assert json.loads(original_body)["job_id"] == str(Job.objects.get().id)

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    for _ in range(3):
        again = client.post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="race-1")
        assert again.status_code == 201 and again.content == original_body
        assert again["Idempotent-Replayed"] == "true"
    assert Job.objects.count() == 1


def test_50_concurrent_accepts_give_one_row_and_one_enqueue(user):
    enqueued = []

    def accept(_):
        job = Job(
            scope="-:1",
            idem_key="acc-1",
            domain="scan",
            event_type="job.requested",
            payload={"x": 1},
            owner=user,
        )
        return accept_once(
            job, unique=("scope", "idem_key"), same=("domain", "payload"), on_accepted=enqueued.append
        )

    results = in_threads(THREADS, accept)
    assert len({job.id for job, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert [job.id for job in enqueued] == [results[0][0].id]
    assert Job.objects.count() == 1


class StalledRequest(threading.Thread):
    """A request, in a thread of its own, that stops inside the view until the gate opens."""

    def __init__(self, user, path, key, counter):
        super().__init__()
        views.GATES["g"] = self.gate = threading.Event()
        self.user, self.path, self.key = user, path, key
        self.response = None
        self.start()
        wait_for(
            lambda: views.CALLS[counter] == 1, timeout=10, message="the stalled request to enter its view"
        )

    def run(self):
        try:
            self.response = post_as(self.user, self.path, self.key)
        finally:
            connection.close()

    def release(self):
        self.gate.set()
        self.join(15)
        return self.response


def post_as(user, path, key):
    client = Client()
    client.force_login(user)
    return client.post(path, data="{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.fixture
def dead_heartbeat(settings):
    """A stalled request whose lease is no longer renewed: what a killed process leaves."""
    settings.IDEMPOTENCY = {"HEARTBEAT": False}


def test_slow_live_request_keeps_its_key_past_its_lease(user, store_clock):
    """The heartbeat renews a running request's 1 s lease: a retry 2.5 s later (on the stores'
    clock) is still told to wait, the view runs once, and the retry then gets its answer."""
    stalled = StalledRequest(user, "/t/gated/?gate=g", "slow-live", "gated")
    for _ in range(5):
        store_clock.advance(0.5)
        renewed = store_clock() + timedelta(seconds=1)  # the keeper renews at a third of the lease
        wait_for(
            lambda r=renewed: IdempotencyRecord.objects.get(key="slow-live").lease_expires_at == r,
            timeout=10,
            message="the lease renewed",
        )
        busy = post_as(user, "/t/gated/?gate=g", "slow-live")
        assert busy.status_code == 409, busy.content
    assert stalled.release().status_code == 201
    replay = post_as(user, "/t/gated/?gate=g", "slow-live")
    assert replay["Idempotent-Replayed"] == "true" and replay.json()["n"] == 1
    assert views.CALLS["gated"] == 1


def test_expired_lease_is_taken_over_and_stale_completion_is_refused(user, dead_heartbeat, store_clock):
    """A request stalls past its 1 s lease; a retry takes the key over and completes; the
    stale request's late completion does not overwrite the retry's answer."""
    stalled = StalledRequest(user, "/t/gated/?gate=g", "slow", "gated")
    busy = post_as(user, "/t/gated/?gate=g", "slow")
    assert busy.status_code == 409 and int(busy["Retry-After"]) >= 1
    store_clock.advance(1.1)  # the stalled request's lease expires
    retry = post_as(user, "/t/gated/?gate=g", "slow")
    assert retry.status_code == 201 and retry.json()["n"] == 2
    assert stalled.release().json()["n"] == 1  # it ran; its answer is just not the stored one
    replay = post_as(user, "/t/gated/?gate=g", "slow")
    assert replay["Idempotent-Replayed"] == "true" and replay.json()["n"] == 2
    assert IdempotencyRecord.objects.get(key="slow").state == "COMPLETED"


# SQLite holds one write lock for a whole transaction: no retry can take a key over while an
# atomic view runs, so this race exists only on a server database.
@pytest.mark.postgres
def test_atomic_view_that_lost_its_lease_rolls_back(user, dead_heartbeat, durable_leases, store_clock):
    stalled = StalledRequest(user, "/t/atomic/?gate=g", "atomic-slow", "atomic")
    store_clock.advance(1.1)  # the stalled request's lease expires
    assert post_as(user, "/t/atomic/?gate=g", "atomic-slow").status_code == 201
    stale = stalled.release()
    assert stale.status_code == 409
    assert stale.json()["type"] == "urn:problem:idempotency-lease-lost"
    assert Job.objects.filter(event_type="effect").count() == 1  # the stale request's effect rolled back
