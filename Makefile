# `make run` starts the whole stack on embedded defaults; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: run test test-fast lint docs setup redis browser bench bench-eventbus bench-gateway bench-cluster bench-jobs bench-tasks chaos clean matrix test-newest test-django60 smoke-newest

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

setup: $(STAMP) redis

# The private Redis of `make run` and `make test` is the system's redis-server (config/redis_server.py
# refuses one without the fix for CVE-2025-49844): Debian's package, installed when root, else named.
# Only its binary is used: the service the package starts on port 6379 is stopped and disabled.
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's redis-server for the private Redis of make run and make test"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null \
	      && { systemctl disable --now redis-server >/dev/null 2>&1 || service redis-server stop >/dev/null 2>&1 || true; }; \
	  else \
	    echo "make run and make test need a redis-server (Redis >= 6.2 with the fix for CVE-2025-49844):" \
	      "sudo apt-get install redis-server, or set REDIS_URL to a Redis of yours" >&2; \
	  fi; }

# The page's test drives Debian's chromium (Playwright cannot download browsers here).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the browser test"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "The browser test needs Debian's chromium: sudo apt-get install chromium" >&2; \
	  fi; }

run: setup
	$(PY) -m config.stack

# The whole suite, its tiers on TEST_WORKERS processes at once (pytest-xdist; tests/conftest.py
# starts the longest first and keeps a module's shared fixture on one worker). Most of its time is
# spent waiting on servers, workers and browsers, so there are more workers than cores.
TEST_WORKERS ?= 4
PARALLEL := PYTEST_ADDOPTS="-n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ADDOPTS)"

test: setup browser
	$(PARALLEL) $(PY) -m pytest $(PYTEST_ARGS)

# The fast tier, for the inner loop: the tests that need neither Redis nor any process of their
# own (pyproject.toml's markers), in this one process. Under a minute.
test-fast: setup
	$(PY) -m pytest -m "not redis" $(PYTEST_ARGS)

# ruff (lint and format) and mypy, clean on the whole tree; `make fix` applies ruff's fixes.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

# The documentation site (docs/, Sphinx): warnings are errors, as in CI; the pages land in docs/_build/html.
docs: setup
	$(VENV)/bin/sphinx-build -W --keep-going -b html docs docs/_build/html

fix: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The benchmark's own packages (a server and the PyPI peers) go into the same virtualenv.
$(BENCH_STAMP): $(STAMP) bench/requirements.txt
	$(PY) -m pip install --quiet -r bench/requirements.txt
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) bench/idempotency.py $(BENCH_ARGS)

# The event bus's: publish (single and batched) next to redis-benchmark running the same script, the
# router's drain (bench/REPORT-eventbus.md).
bench-eventbus: $(BENCH_STAMP)
	$(PY) bench/eventbus.py $(BENCH_EVENTBUS_ARGS)

# The gateway's: sockets held by one server process, fan-out, resync after a Redis blip, publish -> frame
# latency (bench/REPORT-gateway.md).
bench-gateway: $(BENCH_STAMP)
	$(PY) bench/gateway.py $(BENCH_GATEWAY_ARGS)

# The bus on a Redis Cluster: 1 master, 3 masters, 3 with classic PUBLISH; Redis CPU per event and
# per master, publish -> frame latency (bench/REPORT-cluster.md).
bench-cluster: $(BENCH_STAMP)
	$(PY) bench/cluster.py $(BENCH_CLUSTER_ARGS)

# Jobs end to end, the headline: ours, Celery + Channels and DBOS Transact in one run (bench/REPORT-jobs.md).
bench-jobs: $(BENCH_STAMP)
	$(PY) bench/jobs.py $(BENCH_JOBS_ARGS)

# Django's tasks end to end: ours, django-tasks-db and plain Celery in one run (bench/REPORT-tasks.md).
bench-tasks: $(BENCH_STAMP)
	$(PY) bench/tasks.py $(BENCH_TASKS_ARGS)

# The long exactly-once run under faults (tests/e2e/harness.py; the short one is in `make test`):
# make chaos CHAOS_ARGS="--jobs 200 --clients 20 --duration 600"
chaos: setup
	$(PY) -m tests.e2e.chaos $(CHAOS_ARGS)

# The toolkit installed from its wheel into a new startproject project outside the checkout,
# run end to end (tests/smoke/run_smoke.sh; docs/reference/versions.md).
.PHONY: smoke
smoke: setup
	PYTHON=$(PY) bash tests/smoke/run_smoke.sh

# The version matrix (noxfile.py; README "Supported versions"): every Django on every Python, the
# dependencies' oldest and newest releases in range, the adapters' public-API fallbacks, the
# smoke test on the newest releases. Run before each release; about two hours on 2 cores.
# One leg: make matrix NOX_ARGS='-s "tests(py3.13-django6.1)"'.
matrix: setup browser
	$(PARALLEL) $(VENV)/bin/nox $(NOX_ARGS)

# The legs .ci/run adds to `make test`: the suite on the newest Django and Python with the newest
# releases in range (deprecations are errors there), and the smoke test on the same.
test-newest: setup browser
	$(PARALLEL) $(VENV)/bin/nox -s "tests(py3.13-django6.1)" -- $(PYTEST_ARGS)

# The django.tasks backend's tests (tests/tasks) on Django 6.0 (Python 3.12), the first Django
# with django.tasks built in: .ci/run's third Django. `make matrix` runs the whole suite there.
test-django60: setup browser
	$(PARALLEL) $(VENV)/bin/nox -s "tests(py3.12-django6.0)" -- tests/tasks $(PYTEST_ARGS)

smoke-newest: setup
	$(VENV)/bin/nox -s smoke

clean:
	rm -rf $(VENV) .nox .run db.sqlite3
