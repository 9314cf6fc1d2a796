"""The demo's own views: /metrics and POST /demo/tasks/.

/metrics: Prometheus exposition of the whole stack's metrics, not public (docs/reference/metrics.md).

With settings.METRICS_TOKEN set (env METRICS_TOKEN), a scrape must carry it as a bearer token
(`Authorization: Bearer <token>`, Prometheus's `authorization` scrape option), from anywhere.
Unset, only clients on this machine (REMOTE_ADDR in 127.0.0.0/8 or ::1) are answered, and not
through a proxy: a request that carries forwarding headers came from elsewhere, even when the
proxy on this machine is what connected. Every other request gets a problem (403, or 401 with a
Bearer challenge).

POST /demo/tasks/ (authenticated, Idempotency-Key required) enqueues the demo's django.tasks
task (config.tasks.record_visit): body {"n": 1..100, "delay": seconds 0..60, default 0}, answer
201 {"task_id": ...}, the task's result id (its job's: GET /api/jobs/<task_id>/ shows it). The
request's key keys the enqueue (eventbus.djangotasks.keys): a retry of the key, or a run of the
view again after a crash mid-request, answers the same task and never enqueues another.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from datetime import timedelta

from django.conf import settings
from django.http import HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from eventbus.exceptions import JobServiceError
from eventbus.metrics import JOBS_IN_FLIGHT
from gateway.api import service_problem
from gateway.parsers import JSONParser
from idempotency.decorators import idempotency_key
from idempotency.exceptions import IdempotencyKeyMismatch
from idempotency.problems import problem, problem_from_error

# Each visit is a progress event of the task (a task's stage holds at most 1000).
MAX_VISITS = 100
MAX_DELAY_SECONDS = 60

# What proxies add (nginx, HAProxy, cloud load balancers): the client is not the peer.
FORWARDING_HEADERS = ("HTTP_FORWARDED", "HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP")


def metrics(request):
    refused = _refusal(request)
    if refused is not None:
        return refused
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)


def _refusal(request) -> HttpResponse | None:
    """None when this request may read the metrics, else the problem to answer."""
    token = getattr(settings, "METRICS_TOKEN", None)
    if token:
        scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
            return None
        response = problem(401, "The metrics need the bearer token of the METRICS_TOKEN setting.")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if _is_loopback(request.META.get("REMOTE_ADDR", "")) and not any(
        header in request.META for header in FORWARDING_HEADERS
    ):
        return None
    return problem(
        403,
        "The metrics answer clients on this machine only; set METRICS_TOKEN to scrape them from elsewhere.",
    )


def _is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, from a dual-stack socket
    return (mapped or ip).is_loopback


def _registry():
    """Every process's metrics when PROMETHEUS_MULTIPROC_DIR is set (`make run` sets it for all its
    processes: the worker's pool, the router and the reclaimer count elsewhere than the web
    process), else this process's own; with the jobs in flight, read from the database now
    (eventbus.metrics.JobsInFlight). The directory is read per request, not at import."""
    # A registry of its own: in multiprocess mode the default one holds this process's values,
    # which are in the directory already (counted twice otherwise).
    registry = CollectorRegistry()
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        MultiProcessCollector(registry, path=path)
    else:
        registry.register(REGISTRY)
    registry.register(JOBS_IN_FLIGHT)
    return registry


# POST /demo/tasks/ ------------------------------------------------------------------------------


class JSONInteger(serializers.IntegerField):
    """An integer as JSON writes one: not a string, a fraction or a boolean."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class JSONNumber(serializers.FloatField):
    """A JSON number: not a string or a boolean."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class VisitRequest(serializers.Serializer):
    n = JSONInteger(min_value=1, max_value=MAX_VISITS)
    delay = JSONNumber(min_value=0, max_value=MAX_DELAY_SECONDS, default=0)


class DemoTasksView(APIView):
    """POST: enqueue record_visit(n), started `delay` seconds from now (see the module doc)."""

    schema = None  # the demo's, not the jobs API that /api/schema/ describes
    permission_classes = [IsAuthenticated]
    parser_classes = [JSONParser]

    @idempotency_key("required", atomic=True)
    def post(self, request):
        # Imported here: on Django 5.2 Django's task API is an optional package (the backport),
        # which the rest of the demo does without.
        from .tasks import record_visit

        body = VisitRequest(data=request.data)
        body.is_valid(raise_exception=True)  # a 400 problem (idempotency.problems)
        n, delay = body.validated_data["n"], body.validated_data["delay"]
        task = (
            record_visit.using(run_after=timezone.now() + timedelta(seconds=delay)) if delay else record_visit
        )
        try:
            # Keyed by the request's key (the idempotency middleware's keyed work), owned by its user.
            result = task.enqueue(n)
        except IdempotencyKeyMismatch as exc:
            return problem_from_error(exc)
        except JobServiceError as exc:  # the user's caps on running and started jobs: a 429
            return service_problem(exc)
        return Response({"task_id": result.id}, status=status.HTTP_201_CREATED)
