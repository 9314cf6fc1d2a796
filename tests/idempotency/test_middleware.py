"""The middleware over every kind of view: keys, replays, storage rules, scopes."""

import json
import uuid

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings

from eventbus.models import Job
from idempotency.models import IdempotencyRecord

from . import views

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.idempotency.urls")]
JSON = "application/json"


def post(client, path, body=None, key=None, **extra):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    data = json.dumps(body if body is not None else {"amount": 10})
    return client.post(path, data=data, content_type=JSON, **headers, **extra)


def problem(response):
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert {"type", "title", "status", "detail"} <= set(body)
    assert body["status"] == response.status_code
    return body


@pytest.mark.parametrize(
    "path, counter",
    [
        ("/t/plain/", "plain"),
        ("/t/drf/", "drf-class"),
        ("/t/drf-func/", "drf-func"),
        ("/t/items/", "viewset-create"),
        ("/t/items/special/", "viewset-special"),
        ("/t/django-class/", "django-class"),
    ],
)
def test_every_kind_of_view_replays(client_for, user, path, counter):
    client = client_for(user)
    first = post(client, path, key="k-1")
    assert first.status_code == 201, first.content
    again = post(client, path, key="k-1")
    assert again.status_code == 201
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    assert views.CALLS[counter] == 1


@pytest.mark.parametrize("path", ["/t/plain/", "/t/drf/", "/t/items/special/", "/t/django-class/"])
def test_required_key_missing_is_400(client_for, user, path):
    response = post(client_for(user), path)
    assert response.status_code == 400
    assert problem(response)["type"] == "urn:problem:idempotency-key-missing"
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", '"unterminated', "a\tb"])
def test_invalid_key_is_400(client_for, user, key):
    response = post(client_for(user), "/t/plain/", key=key)
    assert response.status_code == 400
    assert problem(response)["type"] == "urn:problem:idempotency-key-invalid"
    assert views.CALLS["plain"] == 0


def test_quoted_key_is_the_same_key(client_for, user):
    client = client_for(user)
    post(client, "/t/plain/", key="abc")
    again = post(client, "/t/plain/", key='"abc"')
    assert again["Idempotent-Replayed"] == "true"


def test_optional_and_exempt_policies(client_for, user, settings):
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "DEFAULT_POLICY_VIEWS": "all"}
    client = client_for(user)
    for _ in range(2):
        assert post(client, "/t/default/").status_code == 201  # optional, no key: no idempotency
    assert views.CALLS["default"] == 2
    post(client, "/t/default/", key="d")
    assert post(client, "/t/default/", key="d")["Idempotent-Replayed"] == "true"
    assert views.CALLS["default"] == 3
    for _ in range(2):
        post(client, "/t/exempt/", key="e")
    assert views.CALLS["exempt"] == 2
    for _ in range(2):
        post(client, "/t/items/unmarked/", key="u")  # viewset action without marker: default policy
    assert views.CALLS["viewset-unmarked"] == 1


def test_unmarked_html_views_keep_no_answers_by_default_api_views_do(client_for, user):
    """The default policy covers API views (docs/howto/idempotent-views.md); a plain Django view (a form, the admin)
    without a marker runs every time, its answer never stored, even with a key."""
    client = client_for(user)
    for _ in range(2):
        response = post(client, "/t/default/", key="html")
        assert response.status_code == 201 and "Idempotent-Replayed" not in response
    assert views.CALLS["default"] == 2
    assert not IdempotencyRecord.objects.filter(key="html").exists()
    for _ in range(2):
        post(client, "/t/items/unmarked/", key="api")  # an unmarked DRF action: covered
    assert views.CALLS["viewset-unmarked"] == 1


def test_uncovered_methods_pass_through(client_for, user):
    client = client_for(user)
    for _ in range(2):
        client.put("/t/django-class/", data="{}", content_type=JSON, HTTP_IDEMPOTENCY_KEY="p")
    assert views.CALLS["django-class-put"] == 2
    for _ in range(2):
        client.patch("/t/django-class/", data="{}", content_type=JSON, HTTP_IDEMPOTENCY_KEY="p")
    assert views.CALLS["django-class-patch"] == 1


def test_same_key_other_body_or_query_is_422(client_for, user):
    client = client_for(user)
    post(client, "/t/plain/", {"amount": 10}, key="k")
    other_body = post(client, "/t/plain/", {"amount": 11}, key="k")
    assert other_body.status_code == 422
    assert problem(other_body)["type"] == "urn:problem:idempotency-key-mismatch"
    other_query = post(client, "/t/plain/?coupon=1", {"amount": 10}, key="k")
    assert other_query.status_code == 422
    # Same JSON, other formatting and key order: the same request.
    same = client.post("/t/plain/", data='{ "amount" : 10 }', content_type=JSON, HTTP_IDEMPOTENCY_KEY="k")
    assert same["Idempotent-Replayed"] == "true"
    assert views.CALLS["plain"] == 1


def test_same_key_other_user_executes_independently(client_for, user, other_user):
    a = post(client_for(user), "/t/plain/", key="shared")
    b = post(client_for(other_user), "/t/plain/", key="shared")
    assert b.status_code == 201 and "Idempotent-Replayed" not in b
    assert a.json()["n"] == 1 and b.json()["n"] == 2
    assert IdempotencyRecord.objects.filter(key="shared").count() == 2


def test_token_and_session_of_one_user_share_the_scope(client_for, token_client_for, user):
    first = post(client_for(user), "/t/drf/", key="t")
    again = post(token_client_for(user), "/t/drf/", key="t")
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content


def test_unauthenticated_request_is_refused_and_stores_nothing(client, token_client_for, user):
    response = post(client, "/t/drf/", key="anon")
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Token"
    bad_token = Client(HTTP_AUTHORIZATION="Token not-a-token")
    assert post(bad_token, "/t/drf/", key="anon").status_code == 401
    assert post(client, "/api/jobs/", {"domain": "scan"}, key="anon").status_code == 401
    assert not IdempotencyRecord.objects.exists()
    assert views.CALLS["drf-class"] == 0


def test_replay_keeps_only_allowed_headers(client_for, user):
    client = client_for(user)
    first = post(client, "/t/plain/", key="h")
    assert first.cookies["session-ish"].value == "secret"
    again = post(client_for(user), "/t/plain/", key="h")
    assert again["ETag"] == first["ETag"] and again["Location"] == first["Location"]
    assert again["Content-Type"] == first["Content-Type"]
    assert "X-Internal" not in again
    assert "session-ish" not in again.cookies
    assert "Set-Cookie" not in str(again.serialize_headers())


@pytest.mark.parametrize("code", [500, 502, 503])
def test_5xx_is_not_stored_and_the_retry_executes(client_for, user, code):
    client = client_for(user)
    assert post(client, f"/t/status/{code}/", key="s").status_code == code
    assert IdempotencyRecord.objects.get(key="s").state == "FAILED"
    retry = post(client, f"/t/status/{code}/", key="s")
    assert retry.json()["n"] == 2 and "Idempotent-Replayed" not in retry


@pytest.mark.parametrize("code", [400, 401, 403, 408, 409, 429])
def test_non_final_4xx_are_never_replayed(client_for, user, code):
    client = client_for(user)
    post(client, f"/t/status/{code}/", key="n")
    again = post(client, f"/t/status/{code}/", key="n")
    assert again.json()["n"] == 2 and "Idempotent-Replayed" not in again


@pytest.mark.parametrize("code", [200, 201, 202, 204, 301, 302, 303, 307, 308, 404, 410, 422])
def test_final_answers_are_replayed(client_for, user, code):
    client = client_for(user)
    first = post(client, f"/t/status/{code}/", key="f")
    again = post(client, f"/t/status/{code}/", key="f")
    assert again.status_code == code and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert views.CALLS[f"status-{code}"] == 1


@pytest.mark.parametrize(
    "store",
    [
        "idempotency.stores.db.DatabaseStore",
        pytest.param("idempotency.stores.cached.CachedStore", marks=pytest.mark.redis),
    ],
)
@pytest.mark.parametrize("path", ["/t/form/", "/t/form-atomic/"])
def test_a_retried_post_redirect_get_form_replays_its_redirect(settings, client_for, user, path, store):
    """A 3xx is a final answer (docs/reference/idempotency.md). The retried form post gets the same redirect, and the
    view (its row) ran once; the cookie the first answer set is not restored."""
    settings.IDEMPOTENCY = {"STORE": store}
    client = client_for(user)
    first = client.post(path, {"title": "groceries"}, HTTP_IDEMPOTENCY_KEY="form-1")
    assert first.status_code == 302 and first["Location"].startswith("/notes/")
    assert "flash" in first.cookies
    retry = client_for(user).post(path, {"title": "groceries"}, HTTP_IDEMPOTENCY_KEY="form-1")
    assert retry.status_code == 302
    assert retry["Location"] == first["Location"]
    assert retry["Idempotent-Replayed"] == "true"
    assert "flash" not in retry.cookies
    assert Job.objects.filter(event_type="note").count() == 1
    assert views.CALLS["note"] == 1
    other = client.post(path, {"title": "other"}, HTTP_IDEMPOTENCY_KEY="form-1")
    assert other.status_code == 422


def test_exception_is_not_stored_and_the_retry_executes(client_for, user):
    client = client_for(user)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            post(client, "/t/boom/", key="b")
    assert views.CALLS["boom"] == 2
    assert IdempotencyRecord.objects.get(key="b").state == "FAILED"


def test_exception_answers_500_to_a_real_client(user):
    client = Client(raise_request_exception=False)
    client.force_login(user)
    assert post(client, "/t/boom/", key="b").status_code == 500
    assert post(client, "/t/boom/", key="b").status_code == 500
    assert views.CALLS["boom"] == 2


def test_streaming_response_is_not_stored(client_for, user):
    client = client_for(user)
    for _ in range(2):
        response = post(client, "/t/streaming/", key="st")
        assert b"".join(response.streaming_content) == b"ab"
    assert views.CALLS["streaming"] == 2


def test_problem_json_for_unknown_api_paths(client_for, user):
    response = client_for(user).get("/api/nothing-here/")
    assert response.status_code == 404
    problem(response)


@pytest.mark.redis
@override_settings(
    IDEMPOTENCY={
        "STORE": "idempotency.stores.cached.CachedStore",
        "SCOPE_RESOLVER": "tests.idempotency.resolvers.HeaderScopeResolver",
    }
)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/t/plain/", "/t/atomic/"])
def test_cached_replay_of_a_request_makes_zero_queries(path):
    """With a principal that needs no database (here: a header, standing in for any
    stateless authentication), a replay from the cache front touches no database: the first
    replay put the answer there."""
    client = Client(HTTP_X_PRINCIPAL="svc-1")
    first = post(client, path, key=str(uuid.uuid4()))
    key = IdempotencyRecord.objects.get().key
    post(client, path, key=key)  # the first replay: the database answers, and fills the cache
    with CaptureQueriesContext(connection) as queries:
        again = post(client, path, key=key)
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert len(queries) == 0, [q["sql"] for q in queries]


@pytest.mark.parametrize("code", [400, 401, 403, 408, 409, 429])
def test_a_refusal_frees_the_key_for_the_corrected_request(client_for, user, code):
    """Refused before the view's work (Stripe, the draft): nothing is kept, fingerprint
    included, so the corrected request under the same key runs."""
    client = client_for(user)
    assert post(client, f"/t/status/{code}/", {"amount": -1}, key="fix").status_code == code
    assert not IdempotencyRecord.objects.filter(key="fix").exists()
    corrected = post(client, "/t/status/201/", {"amount": 10}, key="fix")
    assert corrected.status_code == 201 and "Idempotent-Replayed" not in corrected


def test_jobs_api_validation_error_then_corrected_request(api_client):
    refused = api_client.post("/api/jobs/", {"domain": "nope"}, format="json", HTTP_IDEMPOTENCY_KEY="fix-job")
    assert refused.status_code == 400
    corrected = api_client.post(
        "/api/jobs/", {"domain": "scan"}, format="json", HTTP_IDEMPOTENCY_KEY="fix-job"
    )
    assert corrected.status_code == 201, corrected.content


@pytest.mark.parametrize("path", ["/t/status/500/", "/t/boom/"])
def test_after_a_5xx_or_an_exception_another_body_is_still_422(user, path):
    client = Client(raise_request_exception=False)
    client.force_login(user)
    assert post(client, path, {"amount": 10}, key="kept").status_code == 500
    assert post(client, path, {"amount": 11}, key="kept").status_code == 422
    assert post(client, path, {"amount": 10}, key="kept").status_code == 500  # the same body runs again


def test_unstored_answer_of_a_non_atomic_view_still_reaches_the_client(client_for, user, monkeypatch, caplog):
    """The view's effects stand: a 500 would invite a retry into a second execution."""
    from django.db import OperationalError

    from idempotency.stores.db import DatabaseStore

    def broken_complete(self, lease, response):
        raise OperationalError("the database went away")

    monkeypatch.setattr(DatabaseStore, "complete", broken_complete)
    response = post(client_for(user), "/t/plain-effect/", key="unstored")
    assert response.status_code == 201 and response.json()["n"] == 1
    assert response["Idempotency-Stored"] == "false"
    assert "could not be stored" in caplog.text
    monkeypatch.undo()
    stored = post(client_for(user), "/t/plain/", key="stored")
    assert "Idempotency-Stored" not in stored


@override_settings(IDEMPOTENCY={"SCOPE_RESOLVER": "tests.idempotency.resolvers.EmptyScopeResolver"})
def test_an_empty_scope_is_refused(client_for, user):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="non-empty"):
        post(client_for(user), "/t/plain/", key="everybody")
    assert views.CALLS["plain"] == 0
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize("header", ['"order-1";origin=app', '"order-1"; origin="app"; v=2', '"order-1"'])
def test_rfc_8941_item_with_parameters_is_its_string(client_for, user, header):
    client = client_for(user)
    assert post(client, "/t/plain/", key="order-1").status_code == 201
    again = post(client, "/t/plain/", key=header)
    assert again["Idempotent-Replayed"] == "true"


def test_problems_link_to_their_documentation(client_for, user):
    client = client_for(user)
    response = post(client, "/t/plain/")
    link = response["Link"]
    assert link.endswith('>; rel="describedby"')
    page = client.get(link[1 : link.index(">")])
    assert page.status_code == 200
    assert b"Idempotency-Key missing" in page.content and b"same key on every retry" in page.content
