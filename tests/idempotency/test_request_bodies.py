"""Any request that works without a key works with one: multipart forms behind the CSRF
check, bodies over DATA_UPLOAD_MAX_MEMORY_SIZE, streamed bodies, under WSGI and ASGI."""

import json

import pytest
from django.middleware.csrf import _get_new_csrf_string
from django.test import AsyncClient, Client
from django.test.client import BOUNDARY, encode_multipart

from eventbus.models import Job
from exactly_once.internals import installed
from idempotency.adapters import django as django_adapter

from . import views

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.idempotency.urls")]
FILE = b"0123456789abcdef" * 4096  # 64 KiB
# A capability of the fast path only (test_adapters tests what the fallback does instead).
streams_large_bodies = pytest.mark.skipif(
    not django_adapter.INTERNALS,
    reason="idempotency.adapters.django is on its public-API fallback (request_body): without "
    "Django's request internals a body over DATA_UPLOAD_MAX_MEMORY_SIZE cannot be hashed and left "
    "unread for the view, and is refused as request.body refuses it",
)


def csrf_client(user):
    """A logged-in browser: the CSRF check is enforced, as in production."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    token = _get_new_csrf_string()
    client.cookies["csrftoken"] = token
    return client, token


def upload(name="a.bin", content=FILE):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, content, content_type="application/octet-stream")


@pytest.mark.parametrize("key", [None, "form-1"])
def test_form_upload_with_csrf_token_in_the_form(user, key):
    """The CSRF check parses the multipart body before the middleware's process_view."""
    client, token = csrf_client(user)
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    if key is None:
        response = client.post(
            "/t/form-upload/", {"csrfmiddlewaretoken": token, "title": "cat", "file": upload()}
        )
        assert response.status_code == 400  # required: no key, no upload (and never a 500)
        return
    data = {"csrfmiddlewaretoken": token, "title": "cat", "file": upload()}
    first = client.post("/t/form-upload/", data, **headers)
    assert first.status_code == 201, first.content
    assert first.json()["files"] == {"file": [["a.bin", len(FILE)]]}
    assert first.json()["fields"]["title"] == "cat"
    again = client.post("/t/form-upload/", {**data, "file": upload()}, **headers)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert views.CALLS["form-upload"] == 1
    other = client.post("/t/form-upload/", {**data, "file": upload(content=FILE[:-1])}, **headers)
    assert other.status_code == 422


def test_drf_session_upload_with_csrf_header(user):
    client, token = csrf_client(user)
    data = {"title": "cat", "file": upload()}
    first = client.post("/t/drf-upload/", data, HTTP_X_CSRFTOKEN=token, HTTP_IDEMPOTENCY_KEY="drf-up")
    assert first.status_code == 201, first.content
    assert first.json()["files"] == {"file": [len(FILE)]}
    again = client.post(
        "/t/drf-upload/",
        {"title": "cat", "file": upload()},
        HTTP_X_CSRFTOKEN=token,
        HTTP_IDEMPOTENCY_KEY="drf-up",
    )
    assert again["Idempotent-Replayed"] == "true"
    assert views.CALLS["drf-upload"] == 1


def test_jobs_api_accepts_a_session_form_post_with_a_key(user):
    client, token = csrf_client(user)
    response = client.post(
        "/api/jobs/", {"domain": "scan"}, HTTP_X_CSRFTOKEN=token, HTTP_IDEMPOTENCY_KEY="form-job"
    )
    assert response.status_code == 201, response.content
    again = client.post(
        "/api/jobs/", {"domain": "scan"}, HTTP_X_CSRFTOKEN=token, HTTP_IDEMPOTENCY_KEY="form-job"
    )
    assert again["Idempotent-Replayed"] == "true"
    assert Job.objects.count() == 1


def test_multipart_retry_with_a_new_boundary_is_the_same_request(client_for, user):
    """A client resending a form builds a new random boundary: the same request all the same."""
    client = client_for(user)

    def send(boundary):
        body = encode_multipart(boundary, {"title": "cat", "file": upload()})
        return client.post(
            "/t/raw-stream/",
            body,
            content_type=f"multipart/form-data; boundary={boundary}",
            HTTP_IDEMPOTENCY_KEY="boundary",
        )

    assert send(BOUNDARY).status_code == 201
    assert send("AnotherBoundary123")["Idempotent-Replayed"] == "true"
    assert views.CALLS["raw-stream"] == 1


@pytest.mark.parametrize("key", [None, "big-1"])
def test_upload_over_data_upload_max_memory_size(settings, user, key):
    """Uploaded files do not count against DATA_UPLOAD_MAX_MEMORY_SIZE: with or without a key,
    the upload goes through, and a keyed one is fingerprinted as a stream."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    client, token = csrf_client(user)
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    response = client.post(
        "/t/drf-upload/", {"title": "big", "file": upload()}, HTTP_X_CSRFTOKEN=token, **headers
    )
    assert response.status_code == 201, response.content
    if key:
        again = client.post(
            "/t/drf-upload/", {"title": "big", "file": upload()}, HTTP_X_CSRFTOKEN=token, **headers
        )
        assert again["Idempotent-Replayed"] == "true"
        changed = client.post(
            "/t/drf-upload/",
            {"title": "big", "file": upload(content=FILE[::-1])},
            HTTP_X_CSRFTOKEN=token,
            **headers,
        )
        assert changed.status_code == 422


@streams_large_bodies
def test_large_raw_body_is_streamed_to_the_view(settings, client_for, user):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    client = client_for(user)
    body = FILE * 4  # 256 KiB
    first = client.post(
        "/t/raw-stream/", body, content_type="application/octet-stream", HTTP_IDEMPOTENCY_KEY="raw"
    )
    assert first.status_code == 201 and first.json()["size"] == len(body)
    again = client.post(
        "/t/raw-stream/", body, content_type="application/octet-stream", HTTP_IDEMPOTENCY_KEY="raw"
    )
    assert again["Idempotent-Replayed"] == "true"
    other = client.post(
        "/t/raw-stream/", body[:-1], content_type="application/octet-stream", HTTP_IDEMPOTENCY_KEY="raw"
    )
    assert other.status_code == 422


def test_api_body_over_the_limit_is_a_problem_not_an_html_page(settings, api_client):
    """DRF 3.18 and later read a JSON body into memory: over the limit they refuse it (as they
    would without a key), and on the API the refusal is problem+json. Nothing is stored: the key
    stays free. Older DRF reads it as a stream and takes it, key or not: the key then replays it."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps({"domain": "scan", "payload": {"blob": "x" * 5000}})
    response = api_client.post(
        "/api/jobs/", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="too-big"
    )
    if installed("djangorestframework") < (3, 18):
        assert response.status_code == 201, response.content
        again = api_client.post(
            "/api/jobs/", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="too-big"
        )
        assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
        assert again.json()["job_id"] == response.json()["job_id"]
        return
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["status"] == 400
    smaller = {"domain": "scan", "payload": {"blob": "x"}}
    assert (
        api_client.post("/api/jobs/", smaller, format="json", HTTP_IDEMPOTENCY_KEY="too-big").status_code
        == 201
    )


@streams_large_bodies
@pytest.mark.django_db(transaction=True)
async def test_asgi_large_upload_is_fingerprinted_from_django_s_spooled_body(settings, user):
    """Under ASGI Django spools the body to a file first: it is hashed and rewound for the view."""
    from asgiref.sync import sync_to_async

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    client = AsyncClient()
    await sync_to_async(client.force_login)(user)
    body = FILE * 2
    kwargs = {"content_type": "application/octet-stream", "headers": {"Idempotency-Key": "asgi-big"}}
    first = await client.post("/t/raw-stream/", body, **kwargs)
    assert first.status_code == 201 and first.json()["size"] == len(body)
    again = await client.post("/t/raw-stream/", body, **kwargs)
    assert again["Idempotent-Replayed"] == "true"
    assert (await client.post("/t/raw-stream/", body + b"!", **kwargs)).status_code == 422


def test_a_browsers_keyed_json_post_with_its_session_and_csrf_token_runs_once(user):
    """SessionAuthentication checks CSRF for a logged-in user, and Django's check reads
    request.POST first: DRF before 3.18 then parsed the JSON body from the stream, which the
    middleware's fingerprint found gone (a 500). Every DRF in range: the job, then its replay."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    token = _get_new_csrf_string()
    client.cookies["csrftoken"] = token
    body = json.dumps({"domain": "scan", "payload": {"n": 1}})
    headers = {"HTTP_X_CSRFTOKEN": token, "HTTP_IDEMPOTENCY_KEY": "browser-1"}
    first = client.post("/api/jobs/", body, content_type="application/json", **headers)
    assert first.status_code == 201, first.content
    again = client.post("/api/jobs/", body, content_type="application/json", **headers)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json()["job_id"] == first.json()["job_id"]
    assert Job.objects.count() == 1


@pytest.mark.parametrize("key", [None, "csrf-1"], ids=["unkeyed", "keyed"])
def test_a_session_post_without_its_csrf_token_is_drfs_403_keyed_or_not(user, key):
    """The middleware authenticates a keyed request with the view's authenticators; a failure
    there left Django's request.user anonymous, so the view's SessionAuthentication no longer saw
    the session: a 401 "credentials were not provided" instead of DRF's 403 "CSRF Failed"."""
    client = Client(enforce_csrf_checks=True)
    client.login(username="alice", password="pw-alice")  # a real session login
    client.cookies["csrftoken"] = _get_new_csrf_string()  # the cookie, not the header
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    body = json.dumps({"domain": "scan", "payload": {}})
    refused = client.post("/api/jobs/", body, content_type="application/json", **headers)
    assert refused.status_code == 403, refused.content
    assert "CSRF Failed" in refused.json()["detail"]
    assert not Job.objects.exists()
