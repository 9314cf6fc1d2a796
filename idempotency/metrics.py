"""The idempotency layer's Prometheus counter. A plain Counter, so that it adds up across
processes in prometheus-client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR set before
prometheus_client is imported, as `make run` does): every web process counts its own requests,
and an aggregating /metrics view (config.views) sums them."""

from prometheus_client import Counter

# outcome: miss (first execution), replay, conflict (in flight, 409), mismatch (422),
# invalid (missing or malformed key, 400), takeover (expired lease taken over), lease_lost,
# not_stored (a non-atomic view's answer given unstored), database_unavailable (503: the
# database connection failed during the request), throttled (429 instead of one of the
# layer's own answers: idempotency.throttling).
REQUESTS = Counter(
    "idempotency_requests_total", "Requests seen by the idempotency layer, by outcome", ["outcome"]
)
for _outcome in (
    "miss",
    "replay",
    "conflict",
    "mismatch",
    "invalid",
    "takeover",
    "lease_lost",
    "not_stored",
    "database_unavailable",
    "throttled",
):
    REQUESTS.labels(_outcome)


def count(outcome: str) -> None:
    REQUESTS.labels(outcome).inc()
