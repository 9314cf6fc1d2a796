"""idempotency.authentication.TokenAuthentication: DRF's token authentication with its lookup
compiled once. It must answer exactly as DRF's does, on every database the suite runs on."""

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework import authentication as drf_authentication
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.test import APIRequestFactory

from idempotency.authentication import TokenAuthentication

pytestmark = pytest.mark.django_db


def request_with(header: str | None):
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    return APIRequestFactory().post("/api/jobs/", {}, format="json", **extra)


@pytest.fixture
def token():
    user = User.objects.create_user("ada", email="ada@example.com", password="pw", first_name="Ada")
    return Token.objects.create(user=user)


def test_a_valid_token_gives_the_same_user_and_token_as_drf(token):
    ours = TokenAuthentication().authenticate(request_with(f"Token {token.key}"))
    theirs = drf_authentication.TokenAuthentication().authenticate(request_with(f"Token {token.key}"))
    assert ours is not None and theirs is not None
    (user, got), (drf_user, drf_token) = ours, theirs
    assert (got.pk, got.user_id, got.created) == (drf_token.pk, drf_token.user_id, drf_token.created)
    # Every field, with the database's values converted as the ORM converts them (SQLite's
    # datetimes arrive as text, PostgreSQL's as datetimes).
    assert {f.attname: getattr(user, f.attname) for f in User._meta.concrete_fields} == {
        f.attname: getattr(drf_user, f.attname) for f in User._meta.concrete_fields
    }
    assert type(user.date_joined) is type(drf_user.date_joined)
    assert got.user is user and user.is_authenticated
    assert not user._state.adding and user._state.db == drf_user._state.db


def test_one_query_per_request_and_no_cache_of_tokens(token):
    auth = TokenAuthentication()
    with CaptureQueriesContext(connection) as queries:
        auth.authenticate(request_with(f"Token {token.key}"))
        auth.authenticate(request_with(f"Token {token.key}"))
    assert len(queries) == 2
    token.delete()  # revoked: refused on the very next request
    with pytest.raises(AuthenticationFailed, match="Invalid token"):
        auth.authenticate(request_with(f"Token {token.key}"))


@pytest.mark.parametrize("header", ["Token nope", "Token " + "x" * 40, "Token '--OR--1=1;"])
def test_an_unknown_token_is_refused_as_drf_refuses_it(token, header):
    with pytest.raises(AuthenticationFailed) as ours:
        TokenAuthentication().authenticate(request_with(header))
    with pytest.raises(AuthenticationFailed) as theirs:
        drf_authentication.TokenAuthentication().authenticate(request_with(header))
    assert ours.value.detail == theirs.value.detail == "Invalid token."


def test_an_inactive_user_is_refused(token):
    User.objects.filter(pk=token.user_id).update(is_active=False)
    with pytest.raises(AuthenticationFailed, match="User inactive or deleted"):
        TokenAuthentication().authenticate(request_with(f"Token {token.key}"))


@pytest.mark.parametrize("header", [None, "Bearer abc", "Token", "Token a b"])
def test_other_headers_are_drfs_business(header):
    """No header or another scheme: not ours (None); a malformed Token header: DRF's errors."""
    if header in (None, "Bearer abc"):
        assert TokenAuthentication().authenticate(request_with(header)) is None
    else:
        with pytest.raises(AuthenticationFailed, match="Invalid token header"):
            TokenAuthentication().authenticate(request_with(header))


def test_the_jobs_api_authenticates_with_it(token, settings):
    """The demo project's API uses it: a token request is created and replayed for its user."""
    from rest_framework.test import APIClient

    assert settings.REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"][0] == (
        "idempotency.authentication.TokenAuthentication"
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    body = {"domain": "chat", "payload": {"prompt": "hi"}}
    first = client.post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="auth-1")
    again = client.post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="auth-1")
    assert first.status_code == 201, first.content
    assert (again.status_code, again.json(), again["Idempotent-Replayed"]) == (201, first.json(), "true")
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    refused = bad.post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="auth-1")
    assert refused.status_code == 401
