"""idempotency.adapters: each adapter's fast path (a library's internals) and its fallback (the
library's public API) give the same answers, and each gate takes the fallback for a release
outside its tested range or when EXACTLY_ONCE_INTERNALS=off.

The suite as a whole runs on the path the gates chose (nox's "public" sessions force the
fallbacks); these tests run both paths in one process, whichever that is: a path is forced by
replacing the adapter's function where its caller took it. The fast path runs only where the
installed release is in the tested range (it may not work elsewhere)."""

import io
import json
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.db import connection, transaction
from django.test import Client, RequestFactory
from django.test.client import encode_multipart
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from exactly_once import internals
from idempotency import authentication, fingerprint, scope
from idempotency.adapters import django as django_adapter
from idempotency.adapters import drf as drf_adapter
from idempotency.adapters import psycopg as psycopg_adapter
from idempotency.fingerprint import BodyUnavailable, request_fingerprint
from idempotency.models import IdempotencyRecord
from idempotency.responses import StoredResponse
from idempotency.stores import db
from idempotency.stores.base import Outcome
from idempotency.stores.db import DatabaseStore
from tests.adapters import fresh_module

from . import views

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.idempotency.urls")]
postgresql_only = pytest.mark.postgres  # psycopg's path is PostgreSQL's

# Each adapter: its module, its gate (distribution, [lowest, below): the declared and tested
# range), and what it binds on each path.
ADAPTERS = {
    "django": (
        django_adapter,
        ("Django", (5, 2), (6, 2)),
        {
            "unique_lookup": ("CompiledLookup", "UniqueLookup"),
            "request_body": ("_request_body_internals", "_request_body_public"),
            "ends_transaction": ("_ends_transaction_internals", "_ends_transaction_public"),
            "in_transaction": ("_in_transaction_internals", "_in_transaction_public"),
        },
    ),
    "psycopg": (
        psycopg_adapter,
        ("psycopg", (3, 2), (3, 4)),
        {"literals": ("_literals_internals", "_literals_public")},
    ),
    "drf": (
        drf_adapter,
        ("djangorestframework", (3, 15, 1), (3, 19)),
        {"hand_over_authentication": ("_hand_over_internals", "_hand_over_public")},
    ),
}


def in_range(name: str) -> bool:
    """Whether the installed release of the adapter's library is one its fast path was tested on."""
    distribution, lowest, below = ADAPTERS[name][1]
    found = internals.installed(distribution)
    return found is not None and lowest <= found < below


def needs_fast_path(name: str):
    return pytest.mark.skipif(
        not in_range(name), reason=f"the installed release is outside idempotency.adapters.{name}'s range"
    )


# The gate ---------------------------------------------------------------------------------------


@pytest.fixture
def gate(monkeypatch):
    """Ask an adapter's gate again with `release` installed: the fresh module copy."""
    monkeypatch.setattr(internals, "_decisions", dict(internals._decisions))
    monkeypatch.delenv(internals.ENVIRONMENT_VARIABLE, raising=False)

    def ask(name, release):
        module, (distribution, _, _), _ = ADAPTERS[name]
        asked = []

        def installed(wanted):
            asked.append(wanted)
            return release if wanted == distribution else None

        monkeypatch.setattr(internals, "installed", installed)
        copy = fresh_module(module.__name__)
        assert asked == [distribution]
        return copy

    return ask


def bound(copy, name) -> dict[str, str]:
    """What the module copy bound each of its functions to: "internals" or "public API"."""
    paths = {}
    for function, (fast, public) in ADAPTERS[name][2].items():
        chosen = getattr(copy, function)
        assert chosen in (getattr(copy, fast), getattr(copy, public)), function
        paths[function] = "internals" if chosen is getattr(copy, fast) else "public API"
    return paths


@pytest.mark.parametrize("name", ADAPTERS)
def test_a_release_outside_the_tested_range_takes_the_fallback(gate, name):
    _, (_, lowest, below), functions = ADAPTERS[name]
    older = (lowest[0], lowest[1] - 1, 99) if lowest[1] else (lowest[0] - 1, 99)
    for release in [older, below, (below[0], below[1], 0), (below[0] + 1, 0), None]:
        copy = gate(name, release)
        assert copy.INTERNALS is False, release
        assert bound(copy, name) == dict.fromkeys(functions, "public API")
        assert internals.adapters_in_use()[name] == "public API"


@pytest.mark.parametrize("name", ADAPTERS)
def test_a_tested_release_takes_the_fast_path_unless_the_environment_forces_the_public_api(
    gate, monkeypatch, name
):
    _, (_, lowest, below), functions = ADAPTERS[name]
    for release in [lowest, (*lowest, 7), (below[0], below[1] - 1, 99)]:
        copy = gate(name, release)
        assert copy.INTERNALS is True, release
        assert bound(copy, name) == dict.fromkeys(functions, "internals")
        assert internals.adapters_in_use()[name] == "internals"
    monkeypatch.setenv(internals.ENVIRONMENT_VARIABLE, "off")
    copy = gate(name, lowest)
    assert copy.INTERNALS is False
    assert bound(copy, name) == dict.fromkeys(functions, "public API")


@pytest.mark.parametrize("name", ADAPTERS)
def test_the_module_in_use_took_the_path_its_gate_gives(name):
    module, _, functions = ADAPTERS[name]
    gate_allows = in_range(name) and not internals.forced_off()
    assert module.INTERNALS is gate_allows
    expected = "internals" if module.INTERNALS else "public API"
    assert bound(module, name) == dict.fromkeys(functions, expected)
    assert internals.adapters_in_use()[name] == expected


@pytest.mark.parametrize("name", ["django", "drf"])
def test_the_gates_are_the_declared_ranges(name):
    """The dependencies of pyproject.toml declare exactly the ranges the gates (and the matrix)
    test. (psycopg is the project's choice of driver, not a declared dependency.)"""
    distribution, lowest, below = ADAPTERS[name][1]
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    [declared] = [
        d for d in project["dependencies"] if d.split(">")[0].strip().lower() == distribution.lower()
    ]
    floor, ceiling = (part.split(",")[0] for part in declared.split(">=")[1].split("<"))
    assert (internals.release(floor), internals.release(ceiling)) == (lowest, below)


# Django: the ORM compiler ------------------------------------------------------------------------


@pytest.fixture
def token():
    user = User.objects.create_user("ada", email="ada@example.com", password="pw", first_name="Ada")
    return Token.objects.create(user=user)


def fields_of(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


@needs_fast_path("django")
def test_the_compiled_lookup_and_the_orm_query_give_the_same_objects(token):
    using = Token._default_manager.db
    compiled = django_adapter.CompiledLookup(Token, "key", ("user",), using)
    plain = django_adapter.UniqueLookup(Token, "key", ("user",), using)
    for lookup in (compiled, plain):
        with CaptureQueriesContext(connection) as queries:
            found = lookup.get(token.key)
            user = found.user  # selected with the token: no second query
        assert len(queries) == 1
        assert fields_of(found) == fields_of(token)
        assert fields_of(user) == fields_of(User.objects.get(pk=token.user_id))
        assert type(user.date_joined) is datetime and not user._state.adding and user._state.db == using
        assert lookup.get("no-such-key") is None
    assert fields_of(compiled.get(token.key).user) == fields_of(plain.get(token.key).user)


@pytest.mark.parametrize("path", ["internals", "public API"])
def test_token_authentication_answers_alike_on_either_path(monkeypatch, token, path):
    if path == "internals" and not in_range("django"):
        pytest.skip("the installed Django is outside idempotency.adapters.django's range")
    chosen = django_adapter.CompiledLookup if path == "internals" else django_adapter.UniqueLookup
    monkeypatch.setattr(authentication, "unique_lookup", chosen)
    monkeypatch.setattr(authentication, "_lookups", {})
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert client.post("/t/drf/", {}, format="json", HTTP_IDEMPOTENCY_KEY="t").status_code == 201
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    refused = client.post("/t/drf/", {}, format="json", HTTP_IDEMPOTENCY_KEY="t")
    assert refused.status_code == 401 and refused.json()["detail"] == "Invalid token."
    assert type(authentication._lookups[Token, Token._default_manager.db]) is chosen


# Django: the request's body ----------------------------------------------------------------------

BODY_PATHS = [
    pytest.param("internals", marks=needs_fast_path("django")),
    "public API",
]


@pytest.fixture(params=BODY_PATHS)
def body_path(request, monkeypatch):
    """The fingerprint reads bodies through this path's request_body."""
    fast, public = ADAPTERS["django"][2]["request_body"]
    chosen = getattr(django_adapter, fast if request.param == "internals" else public)
    monkeypatch.setattr(fingerprint, "request_body", chosen)
    return request.param


def on_path(monkeypatch, path, make):
    """The request `make()` builds, fingerprinted on `path`: (fingerprint, request)."""
    fast, public = ADAPTERS["django"][2]["request_body"]
    with monkeypatch.context() as patch:
        patch.setattr(
            fingerprint, "request_body", getattr(django_adapter, fast if path == "internals" else public)
        )
        request = make()
        return request_fingerprint(request), request


def parsed_first(request):
    request.POST  # noqa: B018 (as the CSRF check does: the form is parsed from the stream)
    return request


def read_first(request):
    request.body  # noqa: B018
    return request


rf = RequestFactory()
FILE = b"0123456789abcdef" * 4096  # 64 KiB
REQUESTS = {
    "json": lambda: rf.post("/p/", '{"b": 1, "a": [2, 3]}', content_type="application/json"),
    "urlencoded form": lambda: rf.post("/p/", "b=2&a=1", content_type="application/x-www-form-urlencoded"),
    "multipart, unread": lambda: rf.post("/p/", {"title": "cat", "n": "1"}),
    "multipart, parsed before": lambda: parsed_first(rf.post("/p/", {"title": "cat", "n": "1"})),
    "body read before": lambda: read_first(
        rf.post("/p/", b"\x00raw", content_type="application/octet-stream")
    ),
    "no body": lambda: rf.get("/p/?a=1"),
    "put": lambda: rf.put("/p/", '{"a": 1}', content_type="application/json"),
    "multipart put": lambda: rf.generic(
        "PUT", "/p/", encode_multipart("B0UNDARY", {"a": "1"}), "multipart/form-data; boundary=B0UNDARY"
    ),
}


@needs_fast_path("django")
@pytest.mark.parametrize("kind", REQUESTS)
def test_the_fingerprint_of_a_body_is_the_same_on_either_path(monkeypatch, kind):
    fast, fast_request = on_path(monkeypatch, "internals", REQUESTS[kind])
    public, public_request = on_path(monkeypatch, "public API", REQUESTS[kind])
    assert fast == public
    # The view reads the body as it would have without a fingerprint.
    original = REQUESTS[kind]()
    if kind.startswith("multipart") and original.method == "POST":
        assert public_request.POST == fast_request.POST == original.POST
    else:
        assert public_request.body == fast_request.body == original.body


def big_form(content=FILE, boundary="BoUnDaRy"):
    data = encode_multipart(boundary, {"title": "big", "file": io.BytesIO(content)})
    return lambda: rf.post("/p/", data, content_type=f"multipart/form-data; boundary={boundary}")


def test_a_large_multipart_form_is_fingerprinted_and_left_for_the_view(monkeypatch, settings, body_path):
    """Over DATA_UPLOAD_MAX_MEMORY_SIZE: the fast path hashes the raw stream, the fallback parses
    the form (files spooled by Django's upload handlers) and hashes its fields and files. Either
    way the view gets the form, and a retry with a new boundary is the same request."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    first, request = on_path(monkeypatch, body_path, big_form())
    assert request.POST["title"] == "big" and request.FILES["file"].read() == FILE
    assert on_path(monkeypatch, body_path, big_form(boundary="AnotherOne123"))[0] == first
    assert on_path(monkeypatch, body_path, big_form(content=FILE[::-1]))[0] != first


def test_a_large_upload_that_nothing_parsed_before_reaches_a_drf_view(settings, client_for, user, body_path):
    """No CSRF check parsed it (the client is exempt): on the fallback the fingerprint parses the
    form, and DRF takes Django's parsed form instead of the stream it can no longer read."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    client = client_for(user)

    def send(content=FILE):
        data = {"title": "big", "file": io.BytesIO(content)}
        return client.post("/t/drf-upload/", data, HTTP_IDEMPOTENCY_KEY="upload")

    first = send()
    assert first.status_code == 201, first.content
    assert first.json()["files"] == {"file": [len(FILE)]} and first.json()["data"] == {"title": "big"}
    assert send()["Idempotent-Replayed"] == "true"
    assert send(FILE[::-1]).status_code == 422
    assert views.CALLS["drf-upload"] == 1


def large_raw():
    return rf.post("/p/", FILE, content_type="application/octet-stream")


def test_a_large_raw_body_is_streamed_on_the_fast_path_and_refused_on_the_fallback(
    monkeypatch, settings, body_path
):
    """What only Django's request internals can do: hash a body over the memory limit and leave
    it unread for the view. The fallback refuses it as request.body refuses it (400)."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    if body_path == "public API":
        with pytest.raises(RequestDataTooBig):
            on_path(monkeypatch, body_path, large_raw)
        return
    first, request = on_path(monkeypatch, body_path, large_raw)
    assert request.read() == FILE
    assert on_path(monkeypatch, body_path, large_raw)[0] == first


def test_a_keyed_large_raw_body_runs_on_the_fast_path_and_is_a_400_on_the_fallback(
    settings, client_for, user, body_path
):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = client_for(user).post(
        "/t/raw-stream/", FILE, content_type="application/octet-stream", HTTP_IDEMPOTENCY_KEY="raw"
    )
    if body_path == "internals":
        assert response.status_code == 201 and response.json()["size"] == len(FILE)
    else:
        assert response.status_code == 400
        assert views.CALLS["raw-stream"] == 0 and not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize(
    "content_type", ["application/octet-stream", "multipart/form-data; boundary=BoUnDaRy"]
)
def test_a_body_read_as_a_stream_before_is_unavailable_on_either_path(monkeypatch, body_path, content_type):
    def make():
        data = encode_multipart("BoUnDaRy", {"a": "1"}) if content_type.startswith("multipart") else b"raw"
        request = rf.post("/p/", data, content_type=content_type)
        request.read()
        return request

    with pytest.raises(BodyUnavailable):
        on_path(monkeypatch, body_path, make)


# Django: transaction state -----------------------------------------------------------------------

TRANSACTION_PATHS = [pytest.param("internals", marks=needs_fast_path("django")), "public API"]


def transaction_function(name, path):
    fast, public = ADAPTERS["django"][2][name]
    return getattr(django_adapter, fast if path == "internals" else public)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", TRANSACTION_PATHS)
def test_in_transaction_answers_alike(path):
    in_transaction = transaction_function("in_transaction", path)
    assert in_transaction("default") is False
    with transaction.atomic():
        assert in_transaction("default") is True
        with transaction.atomic():
            assert in_transaction("default") is True
    assert in_transaction("default") is False


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", TRANSACTION_PATHS)
def test_ends_transaction_only_in_an_outermost_block_on_the_fast_path(path):
    ends_transaction = transaction_function("ends_transaction", path)
    with transaction.atomic():
        assert ends_transaction(connection) is (path == "internals")
        with transaction.atomic():
            assert ends_transaction(connection) is False


def test_atomic_request_databases_sees_the_public_decorators_mark(monkeypatch):
    """No public API says whether a view is marked non-atomic: both paths read the mark Django's
    handler reads. Should a Django move it, this fails rather than a non-atomic view running in a
    transaction."""
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)

    def view(request):
        raise AssertionError("not called")

    assert "default" in django_adapter.atomic_request_databases(view)
    assert "default" not in django_adapter.atomic_request_databases(transaction.non_atomic_requests(view))
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", False)
    assert "default" not in django_adapter.atomic_request_databases(view)


ANSWER = StoredResponse(201, (("Content-Type", "application/json"),), b'{"n": 1}')


def claimed(store, key):
    acquisition = store.claim(
        scope="-:0", key=key, fingerprint="f", ttl_seconds=60, method="POST", path="/", using="default"
    )
    assert acquisition.outcome is Outcome.ACQUIRED and acquisition.claim is not None
    return acquisition.claim


def seen_by_another_connection(key):
    from .test_concurrency import in_threads

    return in_threads(1, lambda _: IdempotencyRecord.objects.filter(key=key).exists())[0]


@postgresql_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", TRANSACTION_PATHS)
def test_the_answer_commits_with_the_transaction_on_either_path(monkeypatch, path):
    """The fast path's INSERT carries the COMMIT (committed before Django's block exits); the
    fallback's leaves it to Django's own COMMIT, one round trip more. Committed either way."""
    from psycopg.pq import TransactionStatus

    monkeypatch.setattr(db, "ends_transaction", transaction_function("ends_transaction", path))
    store = DatabaseStore()
    with transaction.atomic():
        assert store.record_answer(claimed(store, "answer"), ANSWER, last=True)
        folded = path == "internals"
        assert seen_by_another_connection("answer") is folded
        status = connection.connection.pgconn.transaction_status
        assert status == (TransactionStatus.IDLE if folded else TransactionStatus.INTRANS)
    assert IdempotencyRecord.objects.get(key="answer").state == "COMPLETED"


# psycopg -----------------------------------------------------------------------------------------

VALUES = [
    "plain",
    "",
    "it's a 'quote'",
    'back\\slash and "double"',
    "ünïcødé ✓ 🐍",
    "%s %(name)s %%",
    None,
    0,
    -(2**63),
    2**63 - 1,
    True,
    datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    b"\x00\x01bytes\xff",
    json.dumps([["Content-Type", "application/json"], ["X", "a\\u0000b"]]),
]


@postgresql_only
@needs_fast_path("psycopg")
def test_the_kept_transformer_and_sql_literal_quote_alike():
    with connection.cursor():  # connected
        fast = psycopg_adapter._literals_internals(connection, VALUES)
        public = psycopg_adapter._literals_public(connection, VALUES)
    assert fast == public
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(public))
        assert list(cursor.fetchone()) == VALUES


@postgresql_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", [pytest.param("internals", marks=needs_fast_path("psycopg")), "public API"])
def test_a_claim_and_its_answer_on_either_path(monkeypatch, path):
    """claim() reads two statements in one message (Cursor.nextset(): public), with the values
    quoted on `path`; record_answer() inserts the answer the same way; the next claim replays it."""
    fast, public = ADAPTERS["psycopg"][2]["literals"]
    monkeypatch.setattr(db, "literals", getattr(psycopg_adapter, fast if path == "internals" else public))
    store = DatabaseStore()
    answer = StoredResponse(201, (("X-Quote", "it's \\ 'q'"),), b"\x00body")
    with transaction.atomic():
        assert store.record_answer(claimed(store, "it's"), answer, last=True)
    with transaction.atomic():
        replay = store.claim(
            scope="-:0", key="it's", fingerprint="f", ttl_seconds=60, method="POST", path="/", using="default"
        )
    assert replay.outcome is Outcome.REPLAY and replay.response == answer


# DRF ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [pytest.param("internals", marks=needs_fast_path("drf")), "public API"])
def test_a_drf_view_gets_the_same_user_and_is_authenticated_once_on_the_fast_path(monkeypatch, token, path):
    fast, public = ADAPTERS["drf"][2]["hand_over_authentication"]
    monkeypatch.setattr(
        scope, "hand_over_authentication", getattr(drf_adapter, fast if path == "internals" else public)
    )
    authentications = []
    real = authentication.TokenAuthentication.authenticate_credentials

    def counted(self, key):
        authentications.append(key)
        return real(self, key)

    monkeypatch.setattr(authentication.TokenAuthentication, "authenticate_credentials", counted)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    first = client.post("/t/drf/", {"a": 1}, format="json", HTTP_IDEMPOTENCY_KEY="drf")
    assert first.status_code == 201 and first.json()["data"] == {"a": 1}
    assert len(authentications) == (1 if path == "internals" else 2)  # the middleware's, the view's
    again = client.post("/t/drf/", {"a": 1}, format="json", HTTP_IDEMPOTENCY_KEY="drf")
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    # Another user's key is another key, on either path.
    other = Token.objects.create(user=User.objects.create_user("bob", password="pw"))
    client.credentials(HTTP_AUTHORIZATION=f"Token {other.key}")
    theirs = client.post("/t/drf/", {"a": 1}, format="json", HTTP_IDEMPOTENCY_KEY="drf")
    assert theirs.status_code == 201 and "Idempotent-Replayed" not in theirs
    assert views.CALLS["drf-class"] == 2


def test_a_session_authenticated_drf_view_answers_alike_on_the_fallback(monkeypatch, user):
    """DRF's session authentication, run again in the view on the fallback, sees the same user."""
    monkeypatch.setattr(scope, "hand_over_authentication", drf_adapter._hand_over_public)
    client = Client()
    client.force_login(user)
    first = client.post("/t/drf/", {"a": "1"}, content_type="application/json", HTTP_IDEMPOTENCY_KEY="s")
    assert first.status_code == 201
    again = client.post("/t/drf/", {"a": "1"}, content_type="application/json", HTTP_IDEMPOTENCY_KEY="s")
    assert again["Idempotent-Replayed"] == "true"
