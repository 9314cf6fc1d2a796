"""HTTP request metrics of the demo: requests by method, view and status class, and their latency.

A middleware of our own rather than django-prometheus: that one's two middlewares are
MiddlewareMixin ones (under ASGI, a trip to a worker thread before and after every request each)
and count twenty families, among them a latency histogram labelled by the raw request method,
which a client sets to anything (a new series per method made up). Here two families, bounded
labels only:

- `view`: the URL pattern's name (`job-list`, `admin:index`; a pattern without one gives its view's
  dotted path), never the path: `/api/jobs/<id>/` is one `job-detail`, whatever the id.
  "<unmatched>" when no pattern matched (a 404 of the resolver) or a middleware answered first;
- `method`: the standard methods, "other" for any other;
- `status`: the status class, "2xx" ... "5xx".

It sits first in MIDDLEWARE, so the latency covers the whole middleware stack and the view, up to
the response's headers (a streaming body is not waited for). It runs in either mode
(sync_capable / async_capable) and never leaves the event loop under ASGI. Counted per process:
in multiprocess mode /metrics adds the web processes up (config.views).
"""

from __future__ import annotations

import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from prometheus_client import Counter, Histogram

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})
UNMATCHED = "<unmatched>"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter(
    "http_requests_total",
    "HTTP requests, by method, view (URL pattern name) and status class",
    ("method", "view", "status"),
)
LATENCY = Histogram(
    "http_request_duration_seconds",
    "HTTP requests' time to the response, by method and view (URL pattern name)",
    ("method", "view"),
    buckets=LATENCY_BUCKETS,
)


def view_name(request) -> str:
    match = getattr(request, "resolver_match", None)
    return (match.view_name or match.route or UNMATCHED) if match is not None else UNMATCHED


def observe(request, response, seconds: float) -> None:
    method = request.method if request.method in METHODS else "other"
    view = view_name(request)
    REQUESTS.labels(method, view, f"{response.status_code // 100}xx").inc()
    LATENCY.labels(method, view).observe(seconds)


class HttpMetricsMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self.__acall__(request)
        started = time.perf_counter()
        response = self.get_response(request)
        observe(request, response, time.perf_counter() - started)
        return response

    async def __acall__(self, request):
        started = time.perf_counter()
        response = await self.get_response(request)
        observe(request, response, time.perf_counter() - started)
        return response
