"""Property-based: whatever the key, body, headers or query string, never a 500."""

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus.models import Job

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.idempotency.urls")]
ANSWERS = {201, 400, 409, 415, 422}
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=300)
keys = st.one_of(header_text, st.from_regex(r'"[ -~]{0,20}"', fullmatch=True), st.uuids().map(str))
bodies = st.one_of(
    st.binary(max_size=200),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    ).map(lambda v: __import__("json").dumps(v).encode()),
)
content_types = st.sampled_from(
    [
        "application/json",
        "text/plain",
        "application/octet-stream",
        "application/x-www-form-urlencoded",
        "application/json; charset=latin-1",
    ]
)
queries = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def client_for(user):
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@SETTINGS
@given(key=keys, body=bodies, content_type=content_types, query=queries)
def test_plain_view_never_500(user, key, body, content_type, query):
    # generic(): the test client passes the bytes as they are (post() would re-encode them).
    response = client_for(user).generic(
        "POST", f"/t/plain/?{query}", data=body, content_type=content_type, HTTP_IDEMPOTENCY_KEY=key
    )
    assert response.status_code in ANSWERS, response.content


@SETTINGS
@given(key=keys, body=bodies, content_type=content_types, query=queries, extra=header_text)
def test_jobs_api_never_500(user, key, body, content_type, query, extra):
    before = Job.objects.count()
    response = client_for(user).generic(
        "POST",
        f"/api/jobs/?{query}",
        data=body,
        content_type=content_type,
        HTTP_IDEMPOTENCY_KEY=key,
        HTTP_X_EXTRA=extra,
    )
    assert response.status_code in ANSWERS, response.content
    if response.status_code >= 400:
        assert response["Content-Type"] == "application/problem+json"
    assert Job.objects.count() - before <= 1
