"""EVENTBUS settings, read through one accessor (see exactly_once.conf.AppSettings)."""

from exactly_once.conf import AppSettings

DEFAULTS: dict[str, object] = {
    # Job types (eventbus.jobtypes.JobType subclasses) by dotted path, besides those registered
    # with @register in an installed app's `jobs` module.
    "JOB_TYPES": (),
    # Domain -> shard count: overrides a job type's `shards`, or adds a domain with no job type
    # (events published with publish_event directly). A job's shard is md5(job_id) mod the count.
    "DOMAINS": {},
    # The bus's Redis (streams, state, history, job channels). None: the project's REDIS_URL
    # setting, else redis://127.0.0.1:6379/0 (eventbus.redis.clients.redis_url).
    "REDIS_URL": None,
    # Redis Cluster client instead of a single server (REDIS_URL names any node).
    "CLUSTER": False,
    "STREAM_MAXLEN": 10_000,  # XADD MAXLEN ~
    "DEDUP_TTL": 7200,  # L1 published:<job>:<stage>:<seq>
    "ROUTER_DEDUP_TTL": 7200,  # L2 router:published:<job>:<seq>
    "STATE_TTL": 3600,  # latest event of a job
    "HISTORY_TTL": 3600,  # per-job history the gateway backfills from
    "HISTORY_MAXLEN": 1000,
    "GROUP": "router",
    "ROUTER_COUNT": 500,  # entries per XREADGROUP
    "ROUTER_BLOCK_MS": 1000,
    # While entries wait for their predecessor, the router reads with this shorter block and
    # retries them after each read; it holds at most DEFER_MAX of them (the rest stay pending).
    "DEFER_RETRY_MS": 50,
    "DEFER_MAX": 10_000,
    # Seconds between consumer-lag samples (XINFO GROUPS) by the router.
    "LAG_INTERVAL": 10,
    "RECLAIM_MIN_IDLE_MS": 300_000,
    "RECLAIM_INTERVAL": 60,
    "RECLAIM_COUNT": 100,
    "MAX_DELIVERIES": 5,  # deliveries of an entry before the reclaimer dead-letters it
    "RECLAIM_CONSUMER": "reclaimer",
    # Seconds without a sign of life (no run lease, no stage started or finished, no message
    # sent) after which an unfinished job is enqueued again (eventbus.job.recovery).
    "RECOVER_AFTER": 300,
    # What a process does when, as it starts, it finds Redis without persistence or with an
    # evicting maxmemory-policy: "warn", "refuse" (exit), or "ignore" (eventbus.redis.durability).
    "REDIS_DURABILITY": "warn",
    # Replicas that must have every published event before publish_event returns (Redis WAIT on
    # the publisher's connection, up to WAIT_TIMEOUT_MS): a failover to a replica then cannot
    # lose an event the job went past, nor the final event of a job the database says ended.
    # None: 1 for a redis+sentinel:// URL, else 0 (no WAIT). Not with EVENTBUS["CLUSTER"].
    "WAIT_REPLICAS": None,
    "WAIT_TIMEOUT_MS": 500,  # below the Sentinel clients' 1 s socket timeout
    # Seconds an ended job (COMPLETED, FAILED, TIMED_OUT...) is kept after it ended, with its stage
    # records; `cleanup_jobs` deletes older ones (eventbus.job.retention). None: kept for ever.
    "KEEP_ENDED_JOBS": 30 * 24 * 3600,
    # Jobs one user may have PENDING or RUNNING at once (eventbus.job.limits.check_running_cap): the
    # jobs API answers one more with a 429 problem and Retry-After. None: no cap.
    "MAX_RUNNING_JOBS_PER_USER": 20,
    # The Retry-After (seconds) of that 429: about how long a job of yours takes to end.
    "MAX_RUNNING_JOBS_RETRY_AFTER": 30,
    # The largest payload a job may have: bytes of its compact JSON (UTF-8), checked by
    # start_job (InvalidPayload; the jobs API answers 400). None: no limit.
    "MAX_PAYLOAD_BYTES": 64 * 1024,
    # Jobs one user may start (retries included) per JOBS_CREATED_PERIOD seconds, counted from
    # the database (eventbus.job.limits.check_creation_cap): the jobs API answers one more with a
    # 429 problem and Retry-After. A replay of a key is never refused. None: no limit.
    "MAX_JOBS_CREATED_PER_USER": 1000,
    "JOBS_CREATED_PERIOD": 3600,
    # Seconds a job's run lease (one run of a job at a time, eventbus.job.runs) lasts unless renewed:
    # how long a job whose worker died waits before another run may take it over. Its run renews
    # it after every event and every third of it while a stage runs.
    "RUN_LEASE_SECONDS": 5,
    # Seconds between the sweeper's looks for delayed starts now due (start_job(run_after=...), a
    # django.tasks task's run_after; eventbus.job.sweep.enqueue_due): how late at most they start.
    "DELAYED_START_POLL": 1.0,
    # Seconds an atomic stage (Stage(atomic=True)) may hold its transaction before its run logs
    # a warning: its code runs inside it, and a long outside call there holds a connection and
    # its row locks all along (eventbus.job.stages).
    "ATOMIC_STAGE_WARN_SECONDS": 5.0,
    # The demo jobs' simulated work per stage, seconds (config.jobs).
    "STAGE_SECONDS": 0.2,
}

eventbus_settings = AppSettings("EVENTBUS", DEFAULTS)
