"""The jobs API's OpenAPI schema (docs/reference/http-api.md): served at /api/schema/, valid, and accurate about the
operations, headers and problem answers of the views it describes; the toolkit works without
drf-spectacular."""

import subprocess
import sys
import textwrap

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db

PROBLEM = "application/problem+json"


@pytest.fixture
def schema(client):
    response = client.get("/api/schema/?format=json")  # public, as the API's documentation
    assert response.status_code == 200, response.content
    return response.json()


def parameters(operation) -> dict:
    return {(p["in"], p["name"]): p for p in operation.get("parameters", [])}


def test_the_schema_describes_the_jobs_api(schema):
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    assert set(paths["/api/jobs/"]) >= {"get", "post"} and set(paths["/api/jobs/{job_id}/"]) >= {"get"}

    create = paths["/api/jobs/"]["post"]
    key = parameters(create)[("header", "Idempotency-Key")]
    assert key["required"] is True
    assert create["requestBody"]["required"] is True
    assert "application/json" in create["requestBody"]["content"]
    assert set(create["responses"]) >= {"201", "400", "401", "409", "422", "429"}
    assert "Idempotent-Replayed" in create["responses"]["201"]["headers"]
    for status in ("400", "401", "409", "422", "429"):
        assert list(create["responses"][status]["content"]) == [PROBLEM], status
    for status in ("409", "429"):
        assert "Retry-After" in create["responses"][status]["headers"]

    listing = paths["/api/jobs/"]["get"]
    query = parameters(listing)
    assert {("query", name) for name in ("state", "domain", "page", "page_size")} <= set(query)
    assert "FAILED" in query[("query", "state")]["schema"]["enum"]
    assert {"scan", "chat"} <= set(query[("query", "domain")]["schema"]["enum"])
    assert query[("query", "page_size")]["schema"]["maximum"] == 100
    assert set(listing["responses"]) >= {"200", "400", "401", "404", "429"}
    page = listing["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(schema["components"]["schemas"][page]["properties"]) == {
        "count",
        "next",
        "previous",
        "results",
    }

    detail = paths["/api/jobs/{job_id}/"]["get"]
    assert set(detail["responses"]) >= {"200", "401", "404", "429"}
    assert list(detail["responses"]["404"]["content"]) == [PROBLEM]
    body = detail["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert {"stages", "retry_of", "latest_event", "error", "payload"} <= set(
        schema["components"]["schemas"][body]["properties"]
    )
    assert set(schema["components"]["schemas"]["Stage"]["properties"]) == {
        "name",
        "label",
        "state",
        "attempts",
        "started_at",
        "finished_at",
        "error",
        "waiting_for",
    }
    assert {"tokenAuth", "cookieAuth"} <= set(schema["components"]["securitySchemes"])


def test_the_schema_is_valid_openapi_without_a_warning(tmp_path):
    """drf-spectacular's own validation (openapi-spec JSON schema), with any warning an error:
    an undescribed field or a guessed type would be one."""
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    assert "/api/jobs/{job_id}/" in (tmp_path / "schema.yaml").read_text()


@pytest.mark.processes
def test_the_toolkit_works_without_drf_spectacular():
    """A project without drf-spectacular: the jobs API's views import and answer, undescribed."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["drf_spectacular"] = None  # as if it were not installed: importing it fails
        import django
        from django.conf import settings
        settings.configure(
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework",
                            "idempotency", "eventbus", "gateway"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            ROOT_URLCONF="gateway.urls",
            REST_FRAMEWORK={"EXCEPTION_HANDLER": "idempotency.problems.drf_exception_handler"},
        )
        django.setup()
        from django.test import Client
        from rest_framework.schemas.openapi import AutoSchema
        from gateway.api import JobDetailView, JobListView
        assert "schema" not in vars(JobListView) and "schema" not in vars(JobDetailView)
        assert type(JobListView().schema) is AutoSchema  # DRF's own
        response = Client().get("/api/jobs/")
        assert response.status_code in (401, 403), response.status_code
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_cancel_and_retry_endpoints_have_their_descriptions_ready():
    """The views of POST /api/jobs/<id>/cancel/ and /retry/ (the jobs engine's) get theirs from
    gateway.openapi by class name: a valid schema, the key optional on cancel, required on retry."""
    from django.urls import path
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.validation import validate_schema
    from rest_framework.views import APIView

    from gateway.openapi import documented

    @documented
    class JobCancelView(APIView):
        def post(self, request, job_id): ...

    @documented
    class JobRetryView(APIView):
        def post(self, request, job_id): ...

    patterns = [
        path("api/jobs/<uuid:job_id>/cancel/", JobCancelView.as_view()),
        path("api/jobs/<uuid:job_id>/retry/", JobRetryView.as_view()),
    ]
    schema = SchemaGenerator(patterns=patterns).get_schema(request=None, public=True)
    validate_schema(schema)
    cancel = schema["paths"]["/api/jobs/{job_id}/cancel/"]["post"]
    retry = schema["paths"]["/api/jobs/{job_id}/retry/"]["post"]
    assert parameters(cancel)[("header", "Idempotency-Key")].get("required", False) is False
    assert parameters(retry)[("header", "Idempotency-Key")]["required"] is True
    assert "202" in cancel["responses"] and "201" in retry["responses"]
    assert list(cancel["responses"]["409"]["content"]) == [PROBLEM] and "requestBody" not in retry

    with pytest.raises(LookupError, match="no entry for Undescribed"):

        @documented
        class Undescribed(APIView):
            pass
