"""Prometheus metrics of the bus, labelled by domain and shard, and of the jobs, labelled by job
type (domain), stage and outcome. The long-running commands serve their own on --metrics-port;
/metrics (config.views) serves every process's.

The bus counts in several processes (Celery's pool publishes, routers apply, the reclaimer
reclaims). With PROMETHEUS_MULTIPROC_DIR set before prometheus_client is first imported, as
`make run` sets it for every process, each process writes its values to files there and /metrics
adds them up.

The jobs in flight (running, pending) are no gauge of this process or of the workers': a worker
incrementing a gauge when a job starts and decrementing it when it ends loses the decrement when it
dies mid-job, and multiprocess mode cannot mend that (a "livesum" gauge drops the dead process's
value at once, while its job is still RUNNING and another worker will finish it; "all" keeps the
+1 for ever). The database knows: JobsInFlight counts them when /metrics is scraped, in the web
process, with one GROUP BY over the (state, enqueued_at) index. See "jobs and stages" below.
"""

import atexit
import logging
import os
from datetime import datetime

from prometheus_client import Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

logger = logging.getLogger(__name__)

LABELS = ("domain", "shard")
LOOPBACK = "127.0.0.1"

_children: dict = {}


def child(metric, *labels):
    """metric.labels(*labels), kept: prometheus_client finds it under a lock at every call,
    and the publisher and the router count on every round trip."""
    key = (metric, labels)
    try:
        return _children[key]
    except KeyError:
        found = _children[key] = metric.labels(*labels)
        return found


PUBLISHED = Counter("eventbus_published_total", "Events added to a shard stream (L1)", LABELS)
DUPLICATES = Counter(
    "eventbus_duplicates_total",
    "Events dropped as duplicates: L1 by the publisher, L2 by the router",
    (*LABELS, "layer"),
)
APPLIED = Counter("eventbus_applied_total", "Events applied by the router: state, history, publish", LABELS)
DEFERRED = Counter(
    "eventbus_deferred_total", "Entries held back because the job's previous event is not applied yet", LABELS
)
DEAD_LETTERS = Counter("eventbus_dead_letters_total", "Entries moved to the dead-letter stream", LABELS)
# One value per shard whichever router measured it, so across processes: the latest measurement of
# a live process (a stopped router's last reading is dropped, see mark_process_dead).
CONSUMER_LAG = Gauge(
    "eventbus_consumer_lag",
    "Entries of the shard stream not yet read by the group",
    LABELS,
    multiprocess_mode="livemostrecent",
)
RECLAIM_MESSAGES = Counter(
    "event_router_reclaim_messages_total", "Idle pending entries claimed by the reclaimer", LABELS
)
RECLAIM_LATENCY = Histogram(
    "event_router_reclaim_latency_seconds",
    "Time to reclaim one shard stream (all its XAUTOCLAIM pages)",
    LABELS,
)


# -- jobs and stages ----------------------------------------------------------------------------
#
# Counted where the change happens, once: a job's end in eventbus.job.lifecycle (a compare-and-set, so
# a task delivered twice or a cancel racing the run counts one end), a stage's attempt in
# eventbus.job.stages, a job retry in eventbus.services.retry_job. Labels are bounded: the domain is a
# registered job type's name, the stage a declared stage's, the outcome one of a few words; never a
# job id or a user.
#
# A job's duration is from its acceptance to its end, not from its start: it is what the job's
# owner waits (queueing and stage retries' backoff included), it is defined for every end (a job
# cancelled or timed out before any run started has no start), and it is measured from two
# database timestamps, whichever process ends the job. The run time is in the stage durations;
# the wait for a worker is eventbus_job_queue_seconds.
#
# Running and pending jobs: JobsInFlight (see the module's docstring), registered by the /metrics
# view (config.views).

DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
JOB_OUTCOMES = ("completed", "failed", "cancelled", "timed_out")
# What happened to a stage's attempt: it finished the stage, or failed and is run again after its
# backoff (its Stage.timeout included), or ran past its Stage.timeout (not retried) or the job's
# deadline, or stopped because the job was cancelled, or failed the job.
STAGE_OUTCOMES = ("completed", "retried", "waiting", "timed_out", "cancelled", "failed")

JOB_DURATION = Histogram(
    "eventbus_job_duration_seconds",
    "Jobs from accepted to ended, by job type and outcome",
    ("domain", "outcome"),
    buckets=DURATION_BUCKETS,
)
JOB_QUEUE = Histogram(
    "eventbus_job_queue_seconds",
    "Jobs from accepted to started (PENDING -> RUNNING), by job type",
    ("domain",),
    buckets=DURATION_BUCKETS,
)
JOBS_ENDED = Counter(
    "eventbus_jobs_ended_total", "Jobs ended, by job type and outcome", ("domain", "outcome")
)
JOBS_RETRIED = Counter(
    "eventbus_jobs_retried_total",
    "Jobs retried (a new job made by retry_job), by the job's type",
    ("domain",),
)
STAGE_DURATION = Histogram(
    "eventbus_stage_duration_seconds",
    "Stage attempts, by job type, stage and the attempt's outcome",
    ("domain", "stage", "outcome"),
    buckets=DURATION_BUCKETS,
)
STAGE_RETRIES = Counter(
    "eventbus_stage_retries_total",
    "Stage attempts that failed and are run again, by job type and stage",
    ("domain", "stage"),
)


def _seconds(since: datetime | None, until: datetime) -> float | None:
    # Another host's clock may be behind ours: a duration is never negative.
    return None if since is None else max((until - since).total_seconds(), 0.0)


def job_started(domain: str, accepted_at: datetime | None, started_at: datetime) -> None:
    """A job went PENDING -> RUNNING (once per job)."""
    waited = _seconds(accepted_at, started_at)
    if waited is not None:
        child(JOB_QUEUE, domain).observe(waited)


def job_ended(domain: str, state: str, accepted_at: datetime | None, ended_at: datetime) -> None:
    """A job reached its final state `state` (once per job)."""
    outcome = state.lower()
    child(JOBS_ENDED, domain, outcome).inc()
    took = _seconds(accepted_at, ended_at)
    if took is not None:
        child(JOB_DURATION, domain, outcome).observe(took)


def job_retried(domain: str) -> None:
    child(JOBS_RETRIED, domain).inc()


def stage_attempt(domain: str, stage: str, outcome: str, seconds: float) -> None:
    """A stage's attempt ended with `outcome` (STAGE_OUTCOMES) after `seconds`; "retried" counts a
    stage retry too."""
    assert outcome in STAGE_OUTCOMES, outcome
    child(STAGE_DURATION, domain, stage, outcome).observe(max(seconds, 0.0))
    if outcome == "retried":
        child(STAGE_RETRIES, domain, stage).inc()


class JobsInFlight:
    """A collector for /metrics: eventbus_jobs_running and eventbus_jobs_pending by job type, read
    from the database at each scrape (a registered type with none reads 0). When the database does
    not answer, both families are left out of that scrape (and a warning is logged): the other
    metrics are still served."""

    def describe(self):
        return []  # not collected when registered: the database is asked at scrape time only

    def collect(self):
        from django.db import DatabaseError
        from django.db.models import Count

        from eventbus.jobtypes import registry
        from eventbus.models import Job

        State = Job.State
        try:
            rows = list(
                Job.objects.filter(state__in=Job.UNFINISHED_STATES)
                .values_list("domain", "state")
                .annotate(count=Count("pk"))
                .order_by()
            )
        except DatabaseError as exc:
            logger.warning("Jobs in flight not measured: the database failed (%s)", exc)
            return
        counts = {state: dict.fromkeys(registry(), 0) for state in (State.RUNNING, State.PENDING)}
        for domain, state, count in rows:
            counts[state][domain] = count
        for state, name, text in (
            (
                State.RUNNING,
                "eventbus_jobs_running",
                "Jobs RUNNING now (a stage's retry waiting included), by job type",
            ),
            (State.PENDING, "eventbus_jobs_pending", "Jobs accepted and not started yet, by job type"),
        ):
            family = GaugeMetricFamily(name, text, labels=("domain",))
            for domain, count in sorted(counts[state].items()):
                family.add_metric((domain,), count)
            yield family


JOBS_IN_FLIGHT = JobsInFlight()


def serve(port: int | None, addr: str = LOOPBACK):
    """Expose the default registry on this port (commands' --metrics-port) of `addr`, this machine
    only unless --metrics-addr says otherwise (docs/reference/metrics.md); None: do nothing. The HTTP server, or None.
    In multiprocess mode too it holds this process's own values: the port answers for this process."""
    if not port:
        return None
    server, _thread = start_http_server(port, addr=addr)
    return server


def mark_process_dead(pid: int | None = None) -> None:
    """Drop a stopped process's live gauges from the multiprocess files (its counters stay: they
    were counted). Nothing to do outside multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid() if pid is None else pid)


# Every process that imports the bus (Django's app registry does) clears its live gauges when it
# exits normally; Celery's pool processes leave with os._exit, config.celery covers those.
atexit.register(mark_process_dead)
