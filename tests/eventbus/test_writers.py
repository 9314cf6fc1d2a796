"""One writer per record, read from the source (`ast`), as tests/test_imports.py reads imports.

- A StageRecord is written by eventbus.job.stagerecords alone: no other module of the apps calls a
  write (create, update, bulk_create, delete, ...) on `StageRecord.objects`, on a job's
  `stage_records`, or on a query or instance made from them, nor saves a stage record, nor
  imports the upsert the stage records are written with.
- A job's state is written by eventbus.job.lifecycle alone: no other module updates a Job query
  (`Job.objects...update()`), nor any query with `state=`, nor saves a model with "state" in
  its update_fields.

The source is read, not a run traced: a write in a branch no test reaches counts the same.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from tests.processes import BASE_DIR

PACKAGES = ("exactly_once", "idempotency", "eventbus", "gateway")
STAGE_RECORD_WRITER = "eventbus/job/stagerecords.py"
JOB_STATE_WRITER = "eventbus/job/lifecycle.py"

# QuerySet, manager and model methods that write rows.
WRITES = {
    "create",
    "get_or_create",
    "update_or_create",
    "bulk_create",
    "bulk_update",
    "update",
    "delete",
    "save",
    "abulk_create",
    "abulk_update",
    "acreate",
    "aget_or_create",
    "aupdate_or_create",
    "aupdate",
    "adelete",
    "asave",
}


def sources(root: Path) -> dict[str, ast.Module]:
    """The apps' modules (migrations excepted) by path relative to `root`."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" not in path.parts:
                found[path.relative_to(root).as_posix()] = ast.parse(path.read_text())
    return found


def receiver_chain(node: ast.expr) -> list[ast.expr]:
    """The receiver of a call and what it was made from: for `a.b(x).c.d()`, [a.b(x).c, a.b(x),
    a.b, a]."""
    chain = []
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        else:
            chain.append(node)
            return chain
        chain.append(node)


def names_in(node: ast.expr) -> set[str]:
    """Every name and attribute name in the expression."""
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
    return found


def stage_record_names(tree: ast.Module) -> set[str]:
    """Local names bound to stage records or their queries: parameters annotated StageRecord,
    names assigned from an expression that names StageRecord, stage_records or such a name, or
    looped over one (until no more are found)."""
    bound: set[str] = set()
    while (more := _bound_once(tree, bound)) != bound:
        bound = more
    return bound


def _bound_once(tree: ast.Module, known: set[str]) -> set[str]:
    bound = set(known)
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            targets, value = [node.target], node.iter
        elif isinstance(node, ast.arg) and node.annotation is not None:
            if {"StageRecord"} & names_in(node.annotation):
                bound.add(node.arg)
            continue
        if value is not None and ({"StageRecord", "stage_records"} | known) & names_in(value):
            for target in targets:
                bound |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return bound


def stage_record_writes(tree: ast.Module) -> list[int]:
    """Lines of the module that write a stage record."""
    local = stage_record_names(tree)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "exactly_once.upsert":
            lines.append(node.lineno)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in WRITES:
            continue
        chain = receiver_chain(node.func.value)
        named = set()
        for link in chain:
            if isinstance(link, ast.Name):
                named.add(link.id)
            elif isinstance(link, ast.Attribute):
                named.add(link.attr)
        if "StageRecord" in named or "stage_records" in named or named & local:
            lines.append(node.lineno)
    return sorted(lines)


def job_state_writes(tree: ast.Module) -> list[int]:
    """Lines of the module that write a job's state (or any row's `state`)."""
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method = node.func.attr
        keywords = {k.arg for k in node.keywords}
        chain = receiver_chain(node.func.value)
        rooted_at_job = any(isinstance(link, ast.Name) and link.id == "Job" for link in chain)
        fields = [k.value for k in node.keywords if k.arg == "update_fields"]
        updates = method in WRITES - {"delete", "adelete", "save", "asave"} and (
            rooted_at_job or "state" in keywords
        )
        saves_state = method in {"save", "asave"} and any(
            isinstance(c, ast.Constant) and c.value == "state" for f in fields for c in ast.walk(f)
        )
        if updates or saves_state:
            lines.append(node.lineno)
    return sorted(lines)


def offenders(found: dict[str, ast.Module], writes, writer: str) -> dict[str, list[int]]:
    return {path: lines for path, tree in found.items() if path != writer and (lines := writes(tree))}


def test_stage_records_are_written_by_stagerecords_alone():
    # The shared core and idempotency import nothing of eventbus (tests/test_imports.py: the
    # floors), and use the upsert for rows of their own.
    found = {
        path: tree for path, tree in sources(BASE_DIR).items() if path.startswith(("eventbus/", "gateway/"))
    }
    assert STAGE_RECORD_WRITER in found and "eventbus/job/stages.py" in found
    assert stage_record_writes(found[STAGE_RECORD_WRITER])  # the writer is seen writing
    assert offenders(found, stage_record_writes, STAGE_RECORD_WRITER) == {}


def test_a_jobs_state_is_written_by_lifecycle_alone():
    found = sources(BASE_DIR)
    assert job_state_writes(found[JOB_STATE_WRITER])  # the writer is seen writing
    # idempotency's records have a state of their own, written by their stores.
    others = {path: tree for path, tree in found.items() if not path.startswith("idempotency/")}
    assert offenders(others, job_state_writes, JOB_STATE_WRITER) == {}


def parse(code: str) -> ast.Module:
    return ast.parse(textwrap.dedent(code))


def test_the_checks_can_fail():
    """Each way of writing is seen; reads and in-memory records are not writes."""
    writes = parse(
        """
        from exactly_once.upsert import insert
        from .models import Job, StageRecord

        def f(job, old, rows: list[StageRecord]):
            StageRecord.objects.create(job=job, stage="a")
            StageRecord.objects.filter(job=job).update(next_attempt_at=None)
            old.stage_records.filter(finished_at__isnull=True).delete()
            record = StageRecord(job=job, stage="b")
            record.save()
            for row in rows:
                row.save(update_fields=["attempts"])
            mine = [r for r in StageRecord.objects.all()]
            mine[0].delete()
        """
    )
    assert stage_record_writes(writes) == [2, 6, 7, 8, 10, 12, 14]
    reads = parse(
        """
        from .models import StageRecord

        def f(job, cache):
            records = list(StageRecord.objects.filter(job=job))
            record = StageRecord(job=job, stage="a")
            record.attempts += 1
            cache.update({"a": 1})
            job.save()
        """
    )
    assert stage_record_writes(reads) == []
    states = parse(
        """
        from .models import Job

        def f(job, rows):
            Job.objects.filter(pk=job.pk).update(enqueued_at=None)
            rows.update(state="RUNNING")
            job.save(update_fields=["state", "ended_at"])
            job.save(update_fields=["payload"])
            Job.objects.filter(pk=job.pk).delete()
        """
    )
    assert job_state_writes(states) == [5, 6, 7]
