"""The jobs API fuzzed from its own schema (docs/reference/http-api.md): schemathesis reads /api/schema/ from a
live server of the demo, authenticates with a user's token, and sends every operation valid and
invalid input (bodies, filters, pages, headers, path parameters). No answer may be a 500, and each
must be one the schema describes (every check of schemathesis but one, EXCLUDED_CHECKS).

schemathesis runs as its command line (`schemathesis run`, its stable interface) against
pytest-django's live server: its pytest plugin's fixture-loaded schemas do not run under pytest 9.
Select it with `-m fuzz` (or leave it out with `-m "not fuzz"`); MAX_EXAMPLES per operation and
phase keep it well under two minutes.
"""

import subprocess
import sys

import pytest
from rest_framework.authtoken.models import Token

from eventbus.models import Job

pytestmark = [pytest.mark.fuzz, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

MAX_EXAMPLES = 30
# Every check but positive_data_acceptance: a schema-valid POST may rightly get a 422 (its
# Idempotency-Key used before with another body: the fuzzer's keys repeat), which it counts
# as a valid request refused.
EXCLUDED_CHECKS = "positive_data_acceptance"


@pytest.fixture
def token(django_user_model):
    fuzzer = django_user_model.objects.create_user("fuzzer", password="pw-fuzzer")
    return Token.objects.create(user=fuzzer).key


@pytest.fixture
def live_api(live_server, settings, redis_client):
    """The demo on a live server, its limits out of the fuzzer's way (they are tested on their
    own): no throttle, no cap on running jobs. The jobs' tasks it enqueues are dropped after."""
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"jobs": None}}
    settings.EVENTBUS = {**settings.EVENTBUS, "MAX_RUNNING_JOBS_PER_USER": None}
    yield live_server.url
    redis_client.flushdb()


def test_no_input_gets_a_500_or_an_undescribed_answer(live_api, token, tmp_path):
    command = [
        sys.executable,
        "-c",
        "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())",
        "run",
        f"{live_api}/api/schema/?format=json",
        "--header",
        f"Authorization: Token {token}",
        "--checks",
        "all",
        "--exclude-checks",
        EXCLUDED_CHECKS,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--workers",
        "1",
        "--seed",
        "24",  # the same cases every run: a failure here is reproducible
        "--suppress-health-check",
        "all",
        "--report-dir",
        str(tmp_path),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-20_000:] + done.stderr[-5_000:]
    # It reached the database: the fuzzer's valid requests started jobs.
    assert Job.objects.filter(owner__username="fuzzer").exists()
