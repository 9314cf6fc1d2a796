"""/metrics: Prometheus exposition of the whole stack's metrics, not public (docs/reference/metrics.md).

With settings.METRICS_TOKEN set (env METRICS_TOKEN), a scrape must carry it as a bearer token
(`Authorization: Bearer <token>`, Prometheus's `authorization` scrape option), from anywhere.
Unset, only clients on this machine (REMOTE_ADDR in 127.0.0.0/8 or ::1) are answered, and not
through a proxy: a request that carries forwarding headers came from elsewhere, even when the
proxy on this machine is what connected. Every other request gets a problem (403, or 401 with a
Bearer challenge).
"""

from __future__ import annotations

import hmac
import ipaddress
import os

from django.conf import settings
from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from eventbus.metrics import JOBS_IN_FLIGHT
from idempotency.problems import problem

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
