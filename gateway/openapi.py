"""The jobs API's OpenAPI description, for drf-spectacular.

drf-spectacular is optional: with it installed, `@documented` gives each jobs view its schema
(request bodies, the Idempotency-Key header, every answer, problem+json errors included), and a
project's schema view (`drf_spectacular.views.SpectacularAPIView`, with REST_FRAMEWORK's
DEFAULT_SCHEMA_CLASS "drf_spectacular.openapi.AutoSchema") describes the jobs API with its own
views. Without it, `@documented` leaves a view as it is and nothing here is imported.

A view's description is its entry in schemas(), by class name and method, built only when it is
documented; `problems()`, `idempotency_key()`, `retry_after()` and `replayed()` are the parts
every keyed endpoint shares.
"""

from __future__ import annotations

from importlib.util import find_spec

from .serializers import (
    MAX_RUN_AFTER,
    JobAcceptedSerializer,
    JobDetailSerializer,
    JobFilterSerializer,
    JobRequestSerializer,
    JobSerializer,
    ProblemSerializer,
    RunAfterField,
    SignalSentSerializer,
)

JSON, PROBLEM = "application/json", "application/problem+json"

# What each error status means on the jobs API.
PROBLEMS = {
    400: "Bad input: no Idempotency-Key (where required) or a malformed one, a body, payload, "
    "filter or page that is not valid (`errors` says which); a signal the job's type does not "
    "declare (`signals` lists those it does).",
    401: "Not authenticated (a session or `Authorization: Token <key>`).",
    403: "Refused: a session-authenticated request without its CSRF token.",
    404: "No such job (or another user's), or a page past the end.",
    409: "A request with this Idempotency-Key is still running (retry after Retry-After seconds); "
    "to cancel, retry or signal: the job is not in a state that allows it (to cancel or signal: it "
    "has ended), or (to retry) it was retried already under another key (`retried_by` names its "
    "retry), or (to signal) the signal was sent already under another key (`signal` names it).",
    422: "This Idempotency-Key was used for another request (another body or path).",
    429: "Throttled (REST_FRAMEWORK['DEFAULT_THROTTLE_RATES']['jobs']), or too many jobs running "
    "(EVENTBUS['MAX_RUNNING_JOBS_PER_USER']), or too many started in the period "
    "(EVENTBUS['MAX_JOBS_CREATED_PER_USER']): retry after Retry-After seconds.",
    503: "The database was unavailable: retry with the same Idempotency-Key after Retry-After seconds.",
}


def documented(view):
    """Class decorator: the view with its OpenAPI description, when drf-spectacular is installed."""
    if find_spec("drf_spectacular") is None:
        return view
    from drf_spectacular.utils import extend_schema_view

    describe_fields()
    described = schemas()
    if view.__name__ not in described:
        raise LookupError(f"gateway.openapi.schemas() has no entry for {view.__name__}: give it one.")
    return extend_schema_view(**described[view.__name__])(view)


def describe_fields() -> None:
    """The OpenAPI description of the request fields of the API's own types (RunAfterField)."""
    from drf_spectacular.utils import extend_schema_field

    extend_schema_field(
        {
            "oneOf": [
                {"type": "string", "format": "date-time"},
                {"type": "number", "minimum": 0, "maximum": int(MAX_RUN_AFTER.total_seconds())},
            ]
        }
    )(RunAfterField)


def problems(*statuses: int) -> dict:
    """The responses of these error statuses: each a problem+json body."""
    from drf_spectacular.utils import OpenApiResponse

    return {
        (status, PROBLEM): OpenApiResponse(ProblemSerializer, description=PROBLEMS[status])
        for status in statuses
    }


def idempotency_key(*, required: bool):
    """The Idempotency-Key request header."""
    from drf_spectacular.utils import OpenApiParameter

    return OpenApiParameter(
        "Idempotency-Key",
        str,
        OpenApiParameter.HEADER,
        required=required,
        description=(
            "A new unique key (a UUID, say) per operation, the same on each retry of it: a retry "
            "gets the first answer (with Idempotent-Replayed: true) and starts nothing again. 1 to 255 "
            'printable ASCII characters, or an RFC 8941 string ("key", its parameters ignored).'
        ),
        # Bare: printable ASCII, no blank at either end (they are stripped) nor a leading quote.
        pattern=r"^[!#-~](?:[ -~]{0,253}[!-~])?$",
    )


def signal_name():
    """The signal's name, in the path."""
    from drf_spectacular.utils import OpenApiParameter

    return OpenApiParameter(
        "name",
        str,
        OpenApiParameter.PATH,
        description="The signal's name: one the job's type declares (its detail's `signals`).",
    )


def retry_after(*statuses: int):
    """The Retry-After header of these answers."""
    from drf_spectacular.utils import OpenApiParameter

    return OpenApiParameter(
        "Retry-After",
        int,
        OpenApiParameter.HEADER,
        response=list(statuses),
        description="Seconds to wait before the request is worth sending again.",
    )


def replayed(*statuses: int):
    """The Idempotent-Replayed header of these answers."""
    from drf_spectacular.utils import OpenApiParameter

    return OpenApiParameter(
        "Idempotent-Replayed",
        str,
        OpenApiParameter.HEADER,
        response=list(statuses),
        enum=["true"],
        description="Present on a replay: the stored answer of the key's first request.",
    )


def schemas() -> dict[str, dict]:
    """Each jobs view's schema, by its class name and method."""
    from drf_spectacular.utils import OpenApiResponse, extend_schema

    return {
        "JobListView": {
            "get": extend_schema(
                summary="Your jobs, newest first",
                description=(
                    "The jobs you started (with the job model's view permission: everyone's), "
                    "newest first, a page at a time (`count`, `next`, `previous`, `results`)."
                ),
                parameters=[JobFilterSerializer, retry_after(429)],
                # Keyed by (status, media type) as the problems are: drf-spectacular takes the
                # lowest key for the main answer (a list: paginated).
                responses={(200, JSON): JobSerializer(many=True), **problems(400, 401, 404, 429)},
            ),
            "post": extend_schema(
                summary="Start a job, once per Idempotency-Key",
                request={"application/json": JobRequestSerializer},
                parameters=[idempotency_key(required=True), retry_after(409, 429, 503), replayed(201)],
                responses={
                    (201, JSON): OpenApiResponse(
                        JobAcceptedSerializer, description="Accepted (or, on a replay, accepted before)."
                    ),
                    **problems(400, 401, 403, 409, 422, 429, 503),
                },
            ),
        },
        # POST /api/jobs/<id>/cancel/ and /retry/ (their views: `@documented class JobCancelView`,
        # `JobRetryView`): no body, the job's own answer.
        "JobCancelView": {
            "post": extend_schema(
                summary="Cancel a job",
                description="A job not started never starts; a running one stops after its stage "
                "(which sees ctx.cancelled). It ends CANCELLED, with its final event.",
                request=None,
                parameters=[idempotency_key(required=False), retry_after(409, 429, 503), replayed(202)],
                responses={
                    (202, JSON): OpenApiResponse(
                        JobAcceptedSerializer, description="Cancelled or cancelling."
                    ),
                    **problems(400, 401, 403, 404, 409, 422, 429, 503),
                },
            ),
        },
        "JobRetryView": {
            "post": extend_schema(
                summary="Retry a FAILED, TIMED_OUT or CANCELLED job, once per Idempotency-Key",
                description="A new job (its retry_of: this one) that reuses this job's finished stages "
                "and runs from the first unfinished one, with the same ctx.key per stage.",
                request=None,
                parameters=[idempotency_key(required=True), retry_after(409, 429, 503), replayed(201)],
                responses={
                    (201, JSON): OpenApiResponse(JobAcceptedSerializer, description="The new job."),
                    **problems(400, 401, 403, 404, 409, 422, 429, 503),
                },
            ),
        },
        "JobSignalView": {
            "post": extend_schema(
                summary="Send a signal to a job, once per Idempotency-Key",
                description="The body (a JSON object; an empty body is `{}`) is the signal's payload, "
                "which a stage's ctx.wait_for(name) returns; a job WAITING for it is woken. One signal "
                "of each name per job: the same key again is the same signal, another key a 409.",
                request={"application/json": {"type": "object", "additionalProperties": True}},
                parameters=[
                    signal_name(),
                    idempotency_key(required=True),
                    retry_after(409, 429, 503),
                    replayed(202),
                ],
                responses={
                    (202, JSON): OpenApiResponse(
                        SignalSentSerializer, description="Sent (or, on a replay, sent before)."
                    ),
                    **problems(400, 401, 403, 404, 409, 422, 429, 503),
                },
            ),
        },
        "JobDetailView": {
            "get": extend_schema(
                summary="One job, its latest event and its stages",
                parameters=[retry_after(429)],
                responses={(200, JSON): JobDetailSerializer, **problems(401, 404, 429)},
            ),
        },
    }
