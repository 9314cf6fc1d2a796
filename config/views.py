from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


def metrics(request):
    """Prometheus exposition of this process's counters (no user data)."""
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)
