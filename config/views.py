"""/metrics: Prometheus exposition of the whole stack's metrics (no user data)."""

import os

from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector


def metrics(request):
    """Every process's metrics when PROMETHEUS_MULTIPROC_DIR is set (`make run` sets it for all its
    processes: the worker's pool, the router and the reclaimer count elsewhere than the web
    process), else this process's own. The directory is read per request, not at import."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        # A registry of its own: the default one holds this process's values, which are in the
        # directory already (counted twice otherwise).
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=path)
    else:
        registry = REGISTRY
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
