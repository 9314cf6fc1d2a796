"""Races with real threads against the real database (run on PostgreSQL in CI)."""
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import close_old_connections, connection
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from idempotency.keys import IdemKey
from idempotency.models import IdempotencyRecord, Operation
from idempotency.services import Command, accept

from . import views

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.idempotency.urls")]
THREADS = 50


def in_threads(n, fn):
    barrier = threading.Barrier(n)

    def run(i):
        try:
            barrier.wait()
            return fn(i)
        finally:
            close_old_connections()
            connection.close()

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


def test_50_threads_post_one_key_one_execution(user):
    token = Token.objects.create(user=user)
    body = {"domain": "scan", "payload": {"image": "cat.png"}}

    def post(_):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        r = client.post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="race-1")
        return r.status_code, r.content, r.get("Retry-After"), r.get("Idempotent-Replayed")

    results = in_threads(THREADS, post)
    assert Operation.objects.count() == 1
    created = [r for r in results if r[0] == 201]
    conflicts = [r for r in results if r[0] == 409]
    assert len(created) + len(conflicts) == THREADS, {r[0] for r in results}
    originals = [r for r in created if r[3] is None]
    assert len(originals) == 1  # one execution; every other 201 is a replay of it
    original_body = originals[0][1]
    assert all(r[1] == original_body for r in created)
    assert all(r[2] and int(r[2]) >= 1 for r in conflicts)
    assert json.loads(original_body)["job_id"] == str(Operation.objects.get().op_id)

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    for _ in range(3):
        again = client.post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="race-1")
        assert again.status_code == 201 and again.content == original_body
        assert again["Idempotent-Replayed"] == "true"
    assert Operation.objects.count() == 1


def test_50_concurrent_accepts_give_one_operation_and_one_enqueue(user):
    enqueued = []
    command = Command(scope="-:1", idem_key=IdemKey("acc-1"), domain="scan", event_type="job.requested",
                      payload={"x": 1}, owner=user)
    results = in_threads(THREADS, lambda _: accept(command, on_accepted=enqueued.append))
    assert len({op.op_id for op, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert [op.op_id for op in enqueued] == [results[0][0].op_id]
    assert Operation.objects.count() == 1


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_expired_lease_is_taken_over_and_stale_completion_is_refused(user):
    """A request stalls past its 1 s lease; a retry takes the key over and completes; the
    stale request's late completion does not overwrite the retry's answer."""
    views.GATES["g"] = gate = threading.Event()
    stale = {}

    def stalled_request():
        try:
            client = Client()
            client.force_login(user)
            stale["response"] = client.post("/t/gated/?gate=g", data="{}", content_type="application/json",
                                            HTTP_IDEMPOTENCY_KEY="slow")
        finally:
            connection.close()

    thread = threading.Thread(target=stalled_request)
    thread.start()
    _wait_for(lambda: views.CALLS["gated"] == 1)
    client = Client()
    client.force_login(user)
    busy = client.post("/t/gated/?gate=g", data="{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="slow")
    assert busy.status_code == 409 and int(busy["Retry-After"]) >= 1
    time.sleep(1.1)  # let the stalled request's lease expire
    retry = client.post("/t/gated/?gate=g", data="{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="slow")
    assert retry.status_code == 201 and retry.json()["n"] == 2
    gate.set()
    thread.join(15)
    assert stale["response"].json()["n"] == 1  # it ran; its answer is just not the stored one
    replay = client.post("/t/gated/?gate=g", data="{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="slow")
    assert replay["Idempotent-Replayed"] == "true" and replay.json()["n"] == 2
    assert IdempotencyRecord.objects.get(key="slow").state == "COMPLETED"


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite holds one write lock for a whole transaction: no retry can take a key over while an "
    "atomic view runs, so this race exists only on a server database",
)
def test_atomic_view_that_lost_its_lease_rolls_back(user):
    views.GATES["g"] = gate = threading.Event()
    stale = {}

    def stalled_request():
        try:
            client = Client()
            client.force_login(user)
            stale["response"] = client.post("/t/atomic/?gate=g", data="{}", content_type="application/json",
                                            HTTP_IDEMPOTENCY_KEY="atomic-slow")
        finally:
            connection.close()

    thread = threading.Thread(target=stalled_request)
    thread.start()
    _wait_for(lambda: views.CALLS["atomic"] == 1)
    time.sleep(1.1)
    client = Client()
    client.force_login(user)
    retry = client.post("/t/atomic/?gate=g", data="{}", content_type="application/json",
                        HTTP_IDEMPOTENCY_KEY="atomic-slow")
    assert retry.status_code == 201
    gate.set()
    thread.join(15)
    assert stale["response"].status_code == 409
    assert stale["response"].json()["type"] == "urn:problem:idempotency-lease-lost"
    assert Operation.objects.filter(event_type="effect").count() == 1  # the stale request's effect rolled back
