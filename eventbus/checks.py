"""System checks: the TTLs of the bus must outlive the retries they guard (docs/reference/settings.md, EVENTBUS).

A dedup key that expires while a copy of its event can still come (a reclaim, a Celery
redelivery after the visibility timeout) lets the copy through: exactly-once is lost.
"""

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured

from eventbus.conf import eventbus_settings


def _visibility_timeout() -> float:
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {}
    return options.get("visibility_timeout", 3600)


@register()
def check_redis_url(app_configs=None, **kwargs):
    """A redis+sentinel:// URL the bus cannot read, or one given with EVENTBUS['CLUSTER'];
    WAIT_REPLICAS that is not a count, or given with a cluster."""
    from eventbus.redis.clients import sentinel_url
    from eventbus.redis.sentinel import BadSentinelURL

    try:
        sentinel_url()
    except (BadSentinelURL, ImproperlyConfigured) as exc:
        return [Error(f"The event bus's Redis URL: {exc}", id="eventbus.E007")]
    replicas = eventbus_settings.WAIT_REPLICAS
    if replicas is not None and (type(replicas) is not int or replicas < 0):
        return [
            Error("EVENTBUS['WAIT_REPLICAS'] is a number of replicas >= 0 (or None).", id="eventbus.E008")
        ]
    if replicas and eventbus_settings.CLUSTER:
        return [
            Error(
                "EVENTBUS['WAIT_REPLICAS'] is for a single master (plain or Sentinel-managed), not a "
                "Redis Cluster.",
                id="eventbus.E008",
            )
        ]
    return []


@register()
def check_job_types(app_configs=None, **kwargs):
    from eventbus.jobtypes import registry

    try:
        registry()
    except (ImproperlyConfigured, ImportError) as exc:
        return [Error(f"EVENTBUS['JOB_TYPES']: {exc}", id="eventbus.E006")]
    return []


def longest_retry_wait(stage) -> float:
    """The longest a stage's retries can wait in all (backoffs at their +20 % jitter)."""
    return sum(stage.backoff * 2 ** (attempt - 1) * 1.2 for attempt in range(1, stage.retries + 1))


@register()
def check_stage_retries(app_configs=None, **kwargs):
    """A stage whose retries wait longer than DEDUP_TTL: its retried attempt republishes its
    events' seqs after their dedup keys expired, and the bus refuses them (out of order)."""
    from eventbus.jobtypes import registry

    try:
        types = registry()
        dedup = eventbus_settings.DEDUP_TTL
    except (ImproperlyConfigured, ImportError):
        return []  # check_job_types and check_ttls say why
    errors = []
    for job_type in types.values():
        for stage in job_type.stages:
            wait = longest_retry_wait(stage)
            if wait >= dedup:
                errors.append(
                    Error(
                        f"Job type {job_type.name!r}, stage {stage.name!r}: its retries may wait {wait:g}s "
                        f"in all, not less than EVENTBUS['DEDUP_TTL'] ({dedup}s).",
                        hint="Lower its retries or backoff, or raise DEDUP_TTL: a retried attempt's events "
                        "must find their dedup keys.",
                        id="eventbus.E009",
                    )
                )
    return errors


@register()
def check_ttls(app_configs=None, **kwargs):
    try:
        s = eventbus_settings
        dedup, router_dedup, state, history = s.DEDUP_TTL, s.ROUTER_DEDUP_TTL, s.STATE_TTL, s.HISTORY_TTL
        reclaim_horizon = s.RECLAIM_MIN_IDLE_MS / 1000 * s.MAX_DELIVERIES
        domains = s.DOMAINS
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="eventbus.E001")]
    errors = []
    if not isinstance(domains, dict) or not all(isinstance(n, int) and n > 0 for n in domains.values()):
        errors.append(Error("EVENTBUS['DOMAINS'] maps each domain to a shard count > 0.", id="eventbus.E002"))
    visibility = _visibility_timeout()
    for name, ttl in (("DEDUP_TTL", dedup), ("ROUTER_DEDUP_TTL", router_dedup)):
        if ttl < reclaim_horizon:
            errors.append(
                Error(
                    f"EVENTBUS[{name!r}] ({ttl}s) is shorter than the reclaim horizon "
                    f"({reclaim_horizon:g}s = RECLAIM_MIN_IDLE_MS/1000 x MAX_DELIVERIES).",
                    hint="A reclaimed copy could arrive after its dedup key expired and be applied twice.",
                    id="eventbus.E003",
                )
            )
        if ttl < visibility:
            errors.append(
                Error(
                    f"EVENTBUS[{name!r}] ({ttl}s) is shorter than Celery's visibility timeout "
                    f"({visibility}s).",
                    hint="A task redelivered after the visibility timeout would republish events whose dedup "
                    "keys are gone.",
                    id="eventbus.E004",
                )
            )
    if history < state:
        errors.append(
            Error(
                f"EVENTBUS['HISTORY_TTL'] ({history}s) is shorter than EVENTBUS['STATE_TTL'] ({state}s).",
                hint="A client resuming while the state exists must find the history it backfills from.",
                id="eventbus.E005",
            )
        )
    lease = s.RUN_LEASE_SECONDS
    if isinstance(lease, bool) or not isinstance(lease, int | float) or not lease > 0:
        errors.append(
            Error(
                f"EVENTBUS['RUN_LEASE_SECONDS'] is a number of seconds > 0, not {lease!r}.",
                hint="A job's run lease (one run of the job at a time) must expire to be renewed.",
                id="eventbus.E011",
            )
        )
    return errors


# The gateway listens to a cluster's job channels with sharded pub/sub (SSUBSCRIBE per node),
# which redis-py's asyncio client has from 8.0 on; the rest of the toolkit runs on 5.0.1 and later.
CLUSTER_REDIS_PY = (8, 0)


@register()
def check_cluster_client(app_configs=None, **kwargs):
    """EVENTBUS['CLUSTER'] with a redis-py too old for the gateway's sharded pub/sub."""
    from exactly_once.internals import installed

    release = installed("redis")
    if not eventbus_settings.CLUSTER or release is None or release >= CLUSTER_REDIS_PY:
        return []
    return [
        Error(
            f"EVENTBUS['CLUSTER'] needs redis-py >= {'.'.join(map(str, CLUSTER_REDIS_PY))} (its asyncio "
            f"client's sharded pub/sub, which the gateway listens with); redis-py "
            f"{'.'.join(map(str, release))} is installed.",
            hint='pip install "redis[hiredis]>=8.0,<8.2"',
            id="eventbus.E010",
        )
    ]


@register(Tags.security)
def check_passwords_in_error_reports(app_configs=None, **kwargs):
    """A setting holding a URL with its password (REDIS_URL, CACHES...) that error reports (the
    DEBUG page, the e-mails to ADMINS) would show: the exception reporter filter in use keeps it."""
    from eventbus.reporting import settings_showing_passwords

    try:
        shown = settings_showing_passwords()
    except (
        ImproperlyConfigured
    ):  # a setting Django refuses to read (an empty SECRET_KEY): its own check says so
        return []
    if not shown:
        return []
    return [
        Warning(
            f"Error reports (the DEBUG page, the error e-mails to ADMINS) would show the password of a "
            f"URL in {', '.join(shown)}: the exception reporter filter in use does not hide it.",
            hint='Set DEFAULT_EXCEPTION_REPORTER_FILTER = "eventbus.reporting.SafeExceptionReporterFilter".',
            id="eventbus.W001",
        )
    ]


@register()
def check_task_backends(app_configs=None, **kwargs):
    """ExactlyOnceBackend's own checks (its OPTIONS, QUEUES and SCHEDULES: eventbus.backends) where
    nothing else runs them: Django 6 runs every TASKS backend's check, but the Django 5.2 backport
    only when `django_tasks` is an installed app."""
    from django.apps import apps

    if not getattr(settings, "TASKS", None) or apps.is_installed("django_tasks"):
        return []
    try:
        from eventbus.djangotasks import compat
        from eventbus.djangotasks.schedules import exactly_once_aliases
    except ImportError:  # no django.tasks here: Django's own check of TASKS says nothing of ours
        return []
    if compat.API == "django.tasks":
        return []
    return [error for alias in exactly_once_aliases() for error in compat.task_backends[alias].check()]
