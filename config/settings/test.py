"""The test suite: DEBUG off, fast hashing, a test database of its own per run."""

import os

from config.private_files import private_dir

from .base import *  # noqa: F401,F403
from .base import DATABASES, DEMO_JOB_TYPES, EVENTBUS, IDEMPOTENCY, RUN_DIR

SECRET_KEY = "test-only-key-not-a-secret"
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

private_dir(RUN_DIR)  # the demo password, the private Redis's config: secrets

# Named per run, so that two runs at once (CI legs, developers) never share a test database.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not :memory:, so race tests' threads share one database through their own connections.
    DATABASES["default"]["TEST"] = {"NAME": str(RUN_DIR / f"test-{os.getpid()}.sqlite3")}
else:
    DATABASES["default"]["TEST"] = {"NAME": f"test_run_{os.getpid()}"}

# Processes the tests start (a Celery worker) use this run's test database: the tests pass its
# resolved name, since the name above is per process. Likewise their job stage time.
if os.environ.get("TEST_DATABASE_NAME"):
    DATABASES["default"]["NAME"] = os.environ["TEST_DATABASE_NAME"]
EVENTBUS = {
    **EVENTBUS,
    "STAGE_SECONDS": float(os.environ.get("EVENTBUS_STAGE_SECONDS", 0)),
    # The chaos harness's processes recover a lost run well within its short run.
    "RECOVER_AFTER": float(os.environ.get("EVENTBUS_RECOVER_AFTER", 300)),
    # The demo's job types, and the test suite's own (written as a user writes them).
    "JOB_TYPES": (
        *DEMO_JOB_TYPES,
        "tests.eventbus.jobtypes.StagedJob",
        "tests.eventbus.jobtypes.FlakyJob",
        "tests.eventbus.jobtypes.PatientFlakyJob",
        "tests.eventbus.jobtypes.DurableJob",
        "tests.eventbus.jobtypes.AtomicLedgerJob",
        "tests.eventbus.jobtypes.FanOutJob",
        "tests.eventbus.jobtypes.RetriedReviewJob",
        # The chaos harness's durable workload (tests/e2e/durable.py).
        "tests.e2e.jobtypes.DurableChaosJob",
        "tests.e2e.jobtypes.DurableChaosChild",
    ),
}
# A keyed request killed with its web process keeps its key until its lease expires: the chaos
# harness's processes take a shorter lease, so that its clients (who wait 60 s for an answer)
# see the key taken over after a daphne kill.
IDEMPOTENCY = {**IDEMPOTENCY, "LEASE_SECONDS": int(os.environ.get("IDEMPOTENCY_LEASE_SECONDS", 60))}
SERVE_STATIC = True  # config.asgi serves /static/ itself
