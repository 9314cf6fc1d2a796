"""Hostile input never reaches a 500 through the idempotency layer (docs/reference/idempotency.md): bodies nested
far deeper than any parser's recursion limit, NUL characters in keys and in stored answers.
Run on SQLite and on PostgreSQL, whose text and jsonb columns refuse NUL."""

import json

import pytest

from idempotency.decorators import GLOBAL, idempotent
from idempotency.fingerprint import canonical_body, request_fingerprint
from idempotency.keys import InvalidKey
from idempotency.models import IdempotencyRecord

from . import views

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.idempotency.urls")]
DEPTH = 5000


def deep(depth=DEPTH, leaf=1) -> bytes:
    return ("[" * depth + json.dumps(leaf) + "]" * depth).encode()


def deep_object(depth=DEPTH) -> bytes:
    return ('{"a":' * depth + "1" + "}" * depth).encode()


def send(client, path, body, key, content_type="application/json"):
    return client.post(path, body, content_type=content_type, HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.parametrize("body", [deep(), deep_object()], ids=["array", "object"])
def test_a_body_nested_5000_deep_is_fingerprinted_by_its_bytes(client_for, user, body):
    client = client_for(user)
    first = send(client, "/t/plain/", body, "deep-1")
    assert first.status_code == 201
    again = send(client, "/t/plain/", body, "deep-1")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert send(client, "/t/plain/", body.replace(b"1", b"2", 1), "deep-1").status_code == 422
    assert views.CALLS["plain"] == 1


def test_canonical_body_never_raises_on_depth():
    for body in (deep(), deep_object(), deep(100_000)):
        assert canonical_body(body, "application/json") == body


def test_a_view_that_refuses_a_deep_body_with_400_leaves_the_key_to_the_corrected_request(client_for, user):
    """The view's answer is a 400 (here raised as BadRequest): nothing is kept,
    fingerprint included, so the corrected body under the same key runs."""
    client = client_for(user)
    refused = send(client, "/t/parse-json/", deep(), "fix-deep")
    assert refused.status_code == 400
    assert not IdempotencyRecord.objects.filter(key="fix-deep").exists()
    corrected = send(client, "/t/parse-json/", b'{"a": 1}', "fix-deep")
    assert corrected.status_code == 201 and corrected.json()["keys"] == ["a"]


def test_the_fingerprint_of_a_deep_body_is_stable(rf):
    request = rf.post("/t/plain/", deep(), content_type="application/json")
    again = rf.post("/t/plain/", deep(), content_type="application/json")
    assert request_fingerprint(request) == request_fingerprint(again)


@pytest.mark.parametrize("key", ["a\x00b", '"a\x00b"', "\x00", "k\x00" * 10])
def test_a_nul_in_the_key_is_a_400_problem(client_for, user, key):
    response = send(client_for(user), "/t/plain/", b"{}", key)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["type"] == "urn:problem:idempotency-key-invalid"
    assert views.CALLS["plain"] == 0 and not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize(
    "store",
    [
        "idempotency.stores.db.DatabaseStore",
        pytest.param("idempotency.stores.cached.CachedStore", marks=pytest.mark.redis),
    ],
)
@pytest.mark.parametrize("path", ["/t/nul/", "/t/nul-atomic/"])
def test_an_answer_with_nul_characters_is_stored_and_replayed(settings, client_for, user, store, path):
    """Non-atomic (the ORM's UPDATE) and atomic (on PostgreSQL, the store's own INSERT)."""
    settings.IDEMPOTENCY = {"STORE": store}
    client = client_for(user)
    first = send(client, path, b"{}", "nul-answer")
    assert first.status_code == 201
    again = send(client, path, b"{}", "nul-answer")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content and b"\x00" in again.content
    # RFC 9110 5.5: a NUL in a field value is replaced by a space before it is kept.
    assert again["ETag"] == '"v 1"'
    assert views.CALLS["nul"] == 1


def test_idempotent_refuses_nul_in_keys_and_owners():
    @idempotent(operation="nul", scope="owner")
    def act(*, owner, idempotency_key):
        return 1

    with pytest.raises(InvalidKey):
        act(owner="t", idempotency_key="a\x00b")
    with pytest.raises(ValueError, match="NUL"):
        act(owner="t\x00", idempotency_key="k")
    assert not IdempotencyRecord.objects.exists()


def test_idempotent_with_arguments_nested_too_deep_is_a_clear_error():
    calls = []

    @idempotent(operation="deep", scope=GLOBAL)
    def act(*, payload, idempotency_key):
        calls.append(1)

    nested: list = []
    for _ in range(DEPTH):
        nested = [nested]
    with pytest.raises(ValueError, match="nested too deep"):
        act(payload=nested, idempotency_key="k")
    assert calls == [] and not IdempotencyRecord.objects.exists()


def accept(**fields):
    """idempotency's generic accept-once of a row (here a job, a model with a UNIQUE scope and key)."""
    from eventbus.models import Job
    from idempotency.services import accept_once

    defaults = {"scope": "-:1", "idem_key": "cmd-1", "domain": "scan", "event_type": "job.requested"}
    return accept_once(
        Job(**{**defaults, **fields}), unique=("scope", "idem_key"), same=("domain", "payload")
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"payload": {"text": "a\x00b"}},
        {"payload": {"nested": [{"k\x00": 1}]}},
        {"biz_key": "order\x00"},
        {"domain": "scan\x00"},
        {"scope": "-:\x001"},
    ],
    ids=["payload-value", "payload-key", "biz_key", "domain", "scope"],
)
def test_accept_refuses_a_nul_on_every_database_alike(fields):
    """SQLite would store it, PostgreSQL's text and jsonb refuse it with a DataError (a 500):
    refused before either sees it, as a BadRequest (a view that lets it through answers 400)."""
    from django.core.exceptions import BadRequest

    from eventbus.models import Job
    from idempotency.services import UnstorableRow

    with pytest.raises(UnstorableRow, match="NUL") as info:
        accept(**fields)
    assert isinstance(info.value, BadRequest)
    assert not Job.objects.exists()


def test_accept_stores_a_backslash_that_only_looks_like_a_nul_escape():
    job, created = accept(payload={"text": "\\u0000 is six characters"})
    assert created
    job.refresh_from_db()
    assert job.payload == {"text": "\\u0000 is six characters"}


def test_accept_refuses_a_payload_nested_too_deep():
    from eventbus.models import Job
    from idempotency.services import UnstorableRow

    nested: dict = {}
    for _ in range(DEPTH):
        nested = {"a": nested}
    with pytest.raises(UnstorableRow, match="deep"):
        accept(payload=nested)
    assert not Job.objects.exists()


def test_the_jobs_api_answers_a_nul_in_the_payload_with_a_400_and_frees_the_key(client_for, user):
    client = client_for(user)
    refused = send(client, "/api/jobs/", b'{"domain": "scan", "payload": {"x": "a\\u0000b"}}', "job-nul")
    assert refused.status_code == 400
    assert refused["Content-Type"] == "application/problem+json"
    corrected = send(client, "/api/jobs/", b'{"domain": "scan", "payload": {"x": "ab"}}', "job-nul")
    assert corrected.status_code == 201


@pytest.mark.parametrize("number", [float("inf"), float("-inf"), float("nan")])
def test_accept_refuses_a_number_json_cannot_carry(number):
    """1e999 parses to inf: PostgreSQL's jsonb refuses it (DataError) and SQLite's JSON_VALID
    check too (IntegrityError, once taken for a race on the key): a 500 either way before."""
    from eventbus.models import Job
    from idempotency.services import UnstorableRow

    with pytest.raises(UnstorableRow, match="NaN or infinity"):
        accept(payload={"x": [number]})
    assert not Job.objects.exists()


def test_the_jobs_api_answers_1e999_with_a_400_and_frees_the_key(client_for, user):
    client = client_for(user)
    refused = send(client, "/api/jobs/", b'{"domain": "scan", "payload": {"x": 1e999}}', "job-inf")
    assert refused.status_code == 400
    assert refused["Content-Type"] == "application/problem+json"
    corrected = send(client, "/api/jobs/", b'{"domain": "scan", "payload": {"x": 1}}', "job-inf")
    assert corrected.status_code == 201


def test_an_integrity_error_that_is_not_the_keys_race_is_raised_not_taken_for_one(monkeypatch):
    """Only a row of the same (scope, key) makes an IntegrityError the race; any other
    violation is raised as it is, never turned into a DoesNotExist."""
    from django.db import IntegrityError

    from idempotency import services

    def violate(*args, **kwargs):
        raise IntegrityError("CHECK constraint failed: some other constraint")

    monkeypatch.setattr(services, "insert", violate)
    with pytest.raises(IntegrityError, match="some other constraint"):
        accept()


# A lone surrogate: valid JSON text, no Unicode character. SQLite stored it (201), then the job's
# detail and its admin page failed to encode it: a 500 for ever.
LONE_SURROGATE_BODIES = [
    b'{"domain": "scan", "payload": {"x": "\\ud800"}}',
    b'{"domain": "scan", "payload": {"\\uDC00key": 1}}',
    b'{"domain": "scan", "payload": {"x": ["ok", "\\ud83d\\ude00\\ude00"]}}',
]


@pytest.mark.parametrize("body", LONE_SURROGATE_BODIES, ids=["value", "key-uppercase", "after-a-pair"])
def test_the_jobs_api_answers_a_lone_surrogate_with_a_400_problem_and_frees_the_key(client_for, user, body):
    from eventbus.models import Job

    client = client_for(user)
    refused = send(client, "/api/jobs/", body, "job-surrogate")
    assert refused.status_code == 400
    assert refused["Content-Type"] == "application/problem+json"
    assert "surrogate" in refused.json()["detail"]
    assert not Job.objects.exists()
    emoji = send(
        client, "/api/jobs/", b'{"domain": "scan", "payload": {"x": "\\ud83d\\ude00"}}', "job-surrogate"
    )
    assert emoji.status_code == 201
    assert client.get(f"/api/jobs/{emoji.json()['job_id']}/").json()["payload"] == {"x": "\U0001f600"}


@pytest.mark.parametrize(
    "fields",
    [
        {"payload": {"x": "\ud800"}},
        {"payload": {"\udfff": 1}},
        {"payload": {"x": ["a\udc00b"]}},
        {"biz_key": "a\ud800"},
    ],
    ids=["payload-value", "payload-key", "payload-nested", "biz_key"],
)
def test_accept_refuses_a_lone_surrogate(fields):
    from eventbus.models import Job
    from idempotency.services import UnstorableRow

    with pytest.raises(UnstorableRow, match="lone surrogate"):
        accept(**fields)
    assert not Job.objects.exists()


def test_start_job_refuses_a_lone_surrogate_and_keeps_an_escaped_backslash(user):
    from eventbus.models import Job
    from eventbus.services import start_job
    from idempotency.services import UnstorableRow

    with pytest.raises(UnstorableRow, match="lone surrogate"):
        start_job("scan", {"x": "\ud800"}, key="surrogate", owner=user)
    assert not Job.objects.exists()
    job, created = start_job("scan", {"x": "\\ud800 is six characters"}, key="surrogate", owner=user)
    assert created and Job.objects.get().payload == {"x": "\\ud800 is six characters"}


def test_idempotent_refuses_a_result_with_a_lone_surrogate():
    @idempotent(operation="surrogate", scope=GLOBAL)
    def answer(*, idempotency_key):
        return {"x": "\ud800"}

    with pytest.raises(TypeError, match="lone surrogate"):
        answer(idempotency_key="k1")
