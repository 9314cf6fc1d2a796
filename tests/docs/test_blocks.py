"""Every fenced block of the README and the documentation's pages (the tutorial aside: `make
smoke` runs it) is tagged, and runs or is checked as its tag says (tests/docs/blocks.py).

The fast tier checks the tags, the Python blocks' names, the commands' arguments (by their own
parsers), the answers' members and the templates; the `processes` tier runs each settings block
through `manage.py check` and imports each code block in a Django process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.template import engines

from tests import test_stack
from tests.docs import blocks
from tests.docs.blocks import Block, all_blocks, blocks_of

BLOCKS = all_blocks()
# Blocks that cannot run here are few; each says why.
MAX_NOT_RUN = 8


def of_kind(*kinds: str) -> list[Block]:
    return [block for block in BLOCKS if block.kind in kinds]


def ids(block: Block) -> str:
    return str(block)


def test_every_block_is_tagged_with_a_known_kind_or_a_reason():
    problems = [problem for block in BLOCKS for problem in blocks.tag_problems(block)]
    assert not problems, "\n".join(problems)
    not_run = [f"{block}: {block.spec}" for block in BLOCKS if block.tag == "not-run"]
    assert len(not_run) <= MAX_NOT_RUN, "\n".join(not_run)
    assert len(BLOCKS) >= 30 and of_kind("python-settings") and of_kind("python")


def test_an_untagged_block_and_a_reasonless_not_run_are_found(tmp_path):
    """The check above can fail: a block without a tag, a tag further up than the line above,
    an unknown kind and an empty reason are each refused; a directive needs no tag."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- run: python -->\n```python\nx = 1\n```\n\n"
        "```sh\nls\n```\n\n"
        "<!-- run: python -->\nSome prose between.\n\n```python\ny = 2\n```\n\n"
        "<!-- run: cobol -->\n```\nz\n```\n\n"
        "<!-- not-run: no -->\n```\nz\n```\n\n"
        "```{toctree}\nother\n```\n"
    )
    found = blocks_of(page)
    assert [block.line for block in found] == [2, 6, 13, 18, 23]
    problems = [problem for block in found for problem in blocks.tag_problems(block)]
    assert [problem.split(": ", 1)[1].split(" ")[0] for problem in problems] == [
        "untagged",
        "untagged",
        "unknown",
        "not-run",
    ]


@pytest.mark.parametrize("block", of_kind("python"), ids=ids)
def test_python_blocks_define_every_name_they_use(block):
    assert not blocks.undefined_names(block.body), f"{block}: names never defined or imported"


def test_a_name_never_imported_is_found():
    source = (
        "from os import path\n\nclass View(APIView):\n    def post(self):\n        return path, request\n"
    )
    assert blocks.undefined_names(source) == ["APIView", "request"]
    assert blocks.undefined_names("from .base import *\nX = Y\n") == []  # a star import: unknowable


@pytest.mark.parametrize("block", of_kind("sh-commands"), ids=ids)
def test_commands_are_accepted_by_their_programs(block):
    problems = [
        problem for words in blocks.command_lines(block.body) if (problem := blocks.command_problem(words))
    ]
    assert not problems, f"{block}: {problems}"


def test_a_command_its_program_refuses_is_found():
    assert blocks.command_problem(["python", "manage.py", "run_router", "--domains", "scan:0"]) is None
    assert "no command" in blocks.command_problem(["python", "manage.py", "route_everything"])
    assert "--shards" in blocks.command_problem(["python", "manage.py", "run_router", "--shards", "4"])
    assert blocks.command_problem(["uvicorn", "config.asgi:application", "--lifespan", "off"]) is None
    assert "--lifespan" in blocks.command_problem(
        ["uvicorn", "config.asgi:application", "--lifespan", "sometimes"]
    )
    assert (
        blocks.command_problem(["celery", "-A", "config", "worker", "-P", "prefork", "--concurrency", "8"])
        is None
    )
    assert "--concurency" in blocks.command_problem(["celery", "-A", "config", "worker", "--concurency", "8"])
    assert "no target" in blocks.command_problem(["make", "deploy-everything"])
    assert "not a program" in blocks.command_problem(["kubectl", "apply"])


@pytest.mark.parametrize("block", of_kind("json"), ids=ids)
def test_answers_have_their_serializers_members(block):
    assert blocks.json_problem(block) is None, f"{block}: {blocks.json_problem(block)}"


def test_an_answer_that_drifted_from_its_serializer_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- run: json gateway.serializers.JobAcceptedSerializer -->\n"
        '```json\n{"job_id": "x", "domain": "scan", "state": "PENDING", "url": "/ws/"}\n```\n'
    )
    [block] = blocks_of(page)
    assert "missing ['ws_url'], not its ['url']" in blocks.json_problem(block)


def test_the_idempotency_settings_shown_are_the_defaults():
    """docs/howto/idempotent-views.md says "defaults shown": each key, and each value."""
    from idempotency.conf import DEFAULTS

    [block] = [block for block in of_kind("python-settings") if "IDEMPOTENCY = {" in block.body]
    namespace: dict = {"INSTALLED_APPS": [], "MIDDLEWARE": []}
    exec(block.body, namespace)
    assert namespace["IDEMPOTENCY"] == DEFAULTS


def job_in_state(owner, state: str):
    """A job of `owner` in that state; RETRIED: a FAILED job with its retry."""
    from eventbus.models import Job
    from eventbus.services import retry_job

    job = Job.objects.create(
        scope=f"docs:{owner.pk}",
        idem_key=f"docs-{state}",
        domain="scan",
        event_type="job.requested",
        owner=owner,
        state="FAILED" if state == "RETRIED" else state,
    )
    if state == "RETRIED":
        retry_job(job.id, key="retry-1")
    return job


@pytest.mark.redis
@pytest.mark.django_db
@pytest.mark.parametrize("block", of_kind("curl"), ids=ids)
def test_curl_examples_answer_as_shown(block, django_user_model):
    """Each curl of the jobs API, sent as written: its status, and the members (and problem
    type) of the answer the page shows after it."""
    import json

    from django.test import Client
    from rest_framework.authtoken.models import Token

    owner = django_user_model.objects.create_user("reader", password="x")
    job = job_in_state(owner, block.environment["JOB"])
    request = blocks.curl_request(
        block.body, {"TOKEN": Token.objects.create(user=owner).key, "JOB": str(job.id)}
    )
    headers = {name: value for name, value in request.headers.items() if name.lower() != "content-type"}
    response = Client(headers=headers).generic(
        request.method,
        request.path,
        request.data or "",
        content_type=request.headers.get("Content-Type", "application/json"),
    )
    assert response.status_code == int(block.option("status")), (block, response.content)
    shown = blocks.next_block(block)
    if shown is not None and shown.kind == "json":
        answer, example = response.json(), json.loads(shown.body)
        assert set(answer) == set(example), (block, answer)
        assert answer.get("type") == example.get("type"), (block, answer)


def test_a_curl_is_read_as_curl_reads_it():
    request = blocks.curl_request(
        "curl -X POST http://127.0.0.1:8000/api/jobs/$JOB/retry/?x=1 \\\n"
        '  -H "Authorization: Token $TOKEN" -H "Idempotency-Key: k" -d \'{"a": 1}\'  # a comment\n',
        {"JOB": "j1", "TOKEN": "t1"},
    )
    assert request == blocks.CurlRequest(
        "POST", "/api/jobs/j1/retry/?x=1", {"Authorization": "Token t1", "Idempotency-Key": "k"}, '{"a": 1}'
    )


@pytest.mark.parametrize("block", of_kind("django-template"), ids=ids)
def test_templates_compile(block):
    engines["django"].from_string(block.body)


def test_every_stack_block_is_one_the_stack_test_runs():
    """tests/test_stack.py runs each `sh-stack NAME` block, found by its NAME."""
    names = {block.args[0] if block.args else "" for block in of_kind("sh-stack")}
    assert names and names <= set(test_stack.STACK_BLOCKS), names


# Run: each settings block checked, each code block imported, by a Django process of its own.


def run_block(block: Block, root: Path) -> subprocess.CompletedProcess:
    settings = blocks.write_project(root, block)
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "REDIS_", "CELERY_", "CACHE_"))
    }
    if block.kind == "python":
        from tests.processes import process_env

        environ = process_env()  # this run's test settings, Redis and database
    environ.update(
        block.environment,
        DJANGO_SETTINGS_MODULE=settings,
        PYTHONPATH=os.pathsep.join([str(root), str(blocks.BASE_DIR)]),
    )
    return subprocess.run(
        [sys.executable, *blocks.command_of(block)],
        cwd=root,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.processes
@pytest.mark.parametrize("block", of_kind("python-settings", "python"), ids=ids)
def test_python_blocks_run(block, tmp_path):
    done = run_block(block, tmp_path)
    assert done.returncode == 0, f"{block}:\n{block.body}\n{done.stdout}\n{done.stderr}"


@pytest.mark.processes
def test_a_settings_block_that_does_not_run_is_found(tmp_path):
    """The run above can fail: a helper of the demo's used without its import, and a check
    --deploy warning (DEBUG on)."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- run: python-settings deploy REDIS_URL=redis://127.0.0.1:1/0 -->\n"
        '```python\nCACHES = {"default": redis_cache("redis://cache:6379/0", "cache")}\n```\n\n'
        "<!-- run: python-settings deploy REDIS_URL=redis://127.0.0.1:1/0 -->\n"
        '```python\nSECRET_KEY = "x" * 60\nDEBUG = True\n```\n'
    )
    undefined, debug = blocks_of(page)
    done = run_block(undefined, tmp_path / "undefined")
    assert done.returncode != 0 and "NameError: name 'redis_cache' is not defined" in done.stderr, done.stderr
    done = run_block(debug, tmp_path / "debug")
    assert done.returncode != 0 and "security.W018" in done.stderr, done.stderr
