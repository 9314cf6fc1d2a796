"""The documentation page of each problem type the middleware answers with, the target of
its `Link: rel="describedby"` header. Included by `path("idempotency/", include("idempotency.urls"))`."""

from django.http import Http404, HttpResponse
from django.utils.html import format_html

from .exceptions import documented_errors


def problem_documentation(request, slug):
    error = documented_errors().get(slug)
    if error is None:
        raise Http404("No such problem type.")
    page = format_html(
        "<!doctype html><html lang=en><meta charset=utf-8><title>{title}</title>"
        "<h1>{title}</h1><p>HTTP {status}, <code>type: {type}</code></p><p>{what}</p><p>{remedy}</p></html>",
        title=error.title,
        status=error.status,
        type=error.type,
        what=error.__doc__ or "",
        remedy=error.remedy,
    )
    return HttpResponse(page)
