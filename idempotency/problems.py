"""RFC 9457 problem details (application/problem+json) for every API error."""

from __future__ import annotations

import json
from http import HTTPStatus

from django.http import HttpResponse
from django.urls import NoReverseMatch, reverse
from django.views import defaults

CONTENT_TYPE = "application/problem+json"
API_PREFIX = "/api/"
DOCS_URL_NAME = "idempotency-problem"


def problem_body(
    status: int, detail: str = "", *, title: str | None = None, type: str = "about:blank", **extra
):
    body = {"type": type, "title": title or HTTPStatus(status).phrase, "status": status, "detail": detail}
    body.update(extra)
    return body


def problem(status: int, detail: str = "", *, title: str | None = None, type: str = "about:blank", **extra):
    body = problem_body(status, detail, title=title, type=type, **extra)
    return HttpResponse(json.dumps(body), status=status, content_type=CONTENT_TYPE)


def documentation_url(problem_type: str) -> str | None:
    """The page that documents a problem type of this app (idempotency.urls), when the project
    includes those URLs; None otherwise (the checks warn about it)."""
    slug = problem_type.rpartition(":")[2]
    try:
        return reverse(DOCS_URL_NAME, kwargs={"slug": slug})
    except NoReverseMatch:
        return None


def problem_from_error(error) -> HttpResponse:
    """An IdempotencyError (or subclass) as its problem response, linked to its documentation
    (`Link: <...>; rel="describedby"`, as the Idempotency-Key draft recommends)."""
    response = problem(error.status, str(error), title=error.title, type=error.type)
    retry_after = getattr(error, "retry_after", None)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    url = documentation_url(error.type)
    if url is not None:
        response["Link"] = f'<{url}>; rel="describedby"'
    return response


def drf_exception_handler(exc, context):
    """DRF's handler, its answer reshaped as problem details.

    Parameters
    ----------
    exc : Exception
        The exception the view raised.
    context : dict
        DRF's context of the view (its request, view, args and kwargs).

    Returns
    -------
    Response or None
        The problem details, headers such as WWW-Authenticate and Retry-After kept; None for an
        exception DRF does not handle.
    """
    from rest_framework.views import exception_handler

    response = exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    if isinstance(data, dict) and set(data) <= {"detail"}:
        detail, extra = str(data.get("detail", "")), {}
    else:
        detail, extra = "The request is not valid.", {"errors": data}
    response.data = problem_body(response.status_code, detail, **extra)
    response.content_type = CONTENT_TYPE
    return response


def problem_handler400(request, exception=None):
    """handler400: a refused request on the API (a body over DATA_UPLOAD_MAX_MEMORY_SIZE, too
    many fields...) gets a problem, never an HTML page."""
    if request.path.startswith(API_PREFIX):
        return problem(
            400, "The request could not be read: it is malformed or over the server's size limits."
        )
    return defaults.bad_request(request, exception)


def problem_handler403(request, exception=None):
    if request.path.startswith(API_PREFIX):
        return problem(403, "You may not do this.")
    return defaults.permission_denied(request, exception)


def problem_handler404(request, exception):
    if request.path.startswith(API_PREFIX):
        return problem(404, "No such resource.")
    return defaults.page_not_found(request, exception)


def problem_handler500(request):
    if request.path.startswith(API_PREFIX):
        return problem(500, "The server failed to answer this request.")
    return defaults.server_error(request)
