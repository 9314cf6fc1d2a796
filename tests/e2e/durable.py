"""The chaos harness's durable workload: `durable_chaos` jobs (tests/e2e/jobtypes.py), whose
clients signal them through the jobs API, and what the checker asserts of them.

A client POSTs the job as any other (tests/e2e/harness.py), then sends it the signal `approve`
with POST /api/jobs/<id>/signals/approve/ under a key of its own: most clients once they see the
job wait for it (GET /api/jobs/<id>/: `waiting_for` is "signal:approve"), some at once (sent
early: the job must keep it for its review). Some send it again under the same key (a replay:
the same 202) and some under another key (refused: 409 `urn:problem:signal-sent`).

The checker: each job COMPLETED, its ledger lines written exactly once (LEDGER_ROWS: the atomic
stage's exactly-once, even when its first attempt's process was killed after its writes), its
sleep not cut short, one JobSignal (the client's key and payload, delivered) whose payload its
review took, exactly CHILDREN children, each COMPLETED, and nothing of it left waiting.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .jobtypes import CHILD, CHILDREN, LEDGER_ROWS, LEDGER_STAGE, SIGNAL, child_seqs

if TYPE_CHECKING:
    from .harness import Answer, ChaosConfig, Checker, Job, Run

SIGNAL_SENT = "urn:problem:signal-sent"  # the 409 of a signal sent already under another key
WAITING_FOR_SIGNAL = f"signal:{SIGNAL}"
# How long a client polls for the job to wait for its signal: its ledger, its sleep (1-3 s) and
# the sweeper's poll take seconds; a worker or Redis down, more.
WAIT_SEEN_WITHIN = 120.0
# The polls' pauses: from the first, 1.5 times longer each up to the last. Every GET counts in
# the user's jobs throttle (120 a minute, POSTs included): a throttled poll waits THROTTLED_PAUSE.
POLL_PAUSES = (0.5, 2.0)
THROTTLED_PAUSE = 5.0


@dataclass
class Signalling:
    """A client's signal to one durable_chaos job, and every answer it got."""

    key: str
    payload: dict
    early: bool  # sent at once, not after the job was seen waiting for it
    replay: bool  # sent a second time under the same key
    rival: bool  # sent under another key too, after the first was accepted
    answers: list[Answer] = field(default_factory=list)  # under `key`
    rival_answers: list[Answer] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seen_waiting: bool = False
    polls: int = 0


def plan(rng: random.Random, config: ChaosConfig, username: str) -> tuple[dict, Signalling]:
    """A durable_chaos job's payload and its client's signal."""
    payload = {"sleep": round(rng.uniform(1, 3), 2)}
    if rng.random() < config.durable_crash_share:
        payload["crash_after_writes"] = True
    signalling = Signalling(
        key=str(uuid.uuid4()),
        payload={"by": username},
        early=rng.random() < config.early_signal_share,
        replay=rng.random() < config.signal_replay_share,
        rival=rng.random() < config.signal_rival_share,
    )
    return payload, signalling


def signal_path(job_id: str) -> str:
    return f"/api/jobs/{job_id}/signals/{SIGNAL}/"


async def signal(run: Run, job: Job) -> None:
    """The client's side: wait (unless early) until the job waits for the signal, send it, a
    replay of it and another key's copy, as planned."""
    plan_ = job.signalling
    assert plan_ is not None and job.job_id is not None
    if not plan_.early and not await wait_until_waiting(run, job):
        return
    path = signal_path(job.job_id)
    for _ in range(2 if plan_.replay else 1):
        answer = await run.send_keyed(job.user, path, plan_.payload, plan_.key, failures=plan_.failures)
        if answer is None:
            return
        plan_.answers.append(answer)
    if plan_.rival:
        rival = {"by": f"{job.user.username}-rival"}
        answer = await run.send_keyed(
            job.user, path, rival, str(uuid.uuid4()), failures=plan_.failures, final_409=(SIGNAL_SENT,)
        )
        if answer is not None:
            plan_.rival_answers.append(answer)


async def wait_until_waiting(run: Run, job: Job) -> bool:
    """Poll the job's detail until it waits for the signal (its `waiting_for`, or its review
    stage WAITING); False, with the failure noted, when it never does."""
    plan_ = job.signalling
    assert plan_ is not None
    deadline = time.monotonic() + WAIT_SEEN_WITHIN
    last: dict | None = None
    pause, longest = POLL_PAUSES
    while time.monotonic() < deadline:
        plan_.polls += 1
        status, detail = await run.get_json(job.user, f"/api/jobs/{job.job_id}/")
        if detail is not None:
            last = detail
            review: dict = next((s for s in detail.get("stages") or () if s.get("name") == "review"), {})
            if detail.get("waiting_for") == WAITING_FOR_SIGNAL or review.get("state") == "WAITING":
                plan_.seen_waiting = True
                return True
            if detail.get("state") in ("COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED"):
                break
        # Other answers (a web server down, a 503, a throttled 429) are polled again.
        await asyncio.sleep(THROTTLED_PAUSE if status == 429 else pause * (0.8 + 0.4 * run.rng.random()))
        pause = min(longest, pause * 1.5)
    plan_.failures.append(
        f"never seen waiting for {SIGNAL!r} (last detail: {last and {k: last.get(k) for k in ('state', 'waiting_for')}})"
    )
    return False


# The checker ---------------------------------------------------------------------------------


def check(checker: Checker, jobs: list[Job]) -> list[tuple[str, str, list[int]]]:
    """Assert what the durable_chaos keys must have left (see the module doc) and count it in
    the figures' `durable`. Returns each child as (job id, domain, expected seqs), which the
    checker's execution and stream checks take as they take the keys' jobs."""
    from django.utils.dateparse import parse_datetime

    from config.models import LedgerEntry
    from eventbus.models import Job as JobRow
    from eventbus.models import JobSignal, StageRecord

    from .harness import UUID_RE, _count  # the harness imports this module

    durable = [job for job in jobs if job.signalling is not None]
    rows = {job.key: checker.rows[job.key] for job in durable if job.key in checker.rows}
    ids = [row.id for row in rows.values()]
    ledger: dict = {}
    for entry in LedgerEntry.objects.filter(job_id__in=ids).order_by("pk"):
        ledger.setdefault(entry.job_id, []).append(entry)
    signals: dict = {}
    for sent in JobSignal.objects.filter(job_id__in=ids):
        signals.setdefault(sent.job_id, []).append(sent)
    records: dict = {}
    for record in StageRecord.objects.filter(job_id__in=ids):
        records.setdefault(record.job_id, {})[record.stage] = record
    children: dict = {}
    for child in JobRow.objects.filter(parent_id__in=ids).order_by("accepted_at"):
        children.setdefault(child.parent_id, []).append(child)
    counts = dict.fromkeys(
        (
            "crashes_planned",
            "ledger_attempts_over_1",
            "ledger_rows",
            "sleeps",
            "signals_sent_early",
            "signals_early_before_review",
            "signals_after_waiting_seen",
            "signal_rows",
            "signal_copies_sent",
            "signal_replayed_202",
            "signal_other_key_409",
            "children",
            "children_completed",
        ),
        0,
    )
    sleep_lags: list[float] = []
    streamed: list[tuple[str, str, list[int]]] = []
    for job in durable:
        plan_ = job.signalling
        assert plan_ is not None
        for failure in plan_.failures:
            checker.fail(f"key {job.key}: the signal {failure}")
        check_signal_answers(checker, job, counts)
        row = rows.get(job.key)
        if row is None:
            continue  # check_job_rows named it
        name = f"durable job {row.id}"
        crash = bool(job.payload.get("crash_after_writes"))
        counts["crashes_planned"] += crash
        # The atomic stage's lines: exactly LEDGER_ROWS, whatever ran again.
        lines = ledger.get(row.id, [])
        counts["ledger_rows"] += len(lines)
        if sorted(e.amount for e in lines) != list(range(1, LEDGER_ROWS + 1)) or any(
            e.stage != LEDGER_STAGE for e in lines
        ):
            checker.fail(
                f"{name}: {len(lines)} ledger rows {[(e.stage, e.amount) for e in lines]} "
                f"(expected {LEDGER_ROWS}, once each)"
            )
        stages = records.get(row.id, {})
        unfinished = [
            s
            for s in ("pay", "pause", "review", "fan_out")
            if getattr(stages.get(s), "finished_at", None) is None
        ]
        if unfinished:
            checker.fail(f"{name}: stages {unfinished} not finished")
            continue
        waiting = [s for s, r in stages.items() if r.waiting_for]
        if waiting:
            checker.fail(f"{name}: stages {waiting} still waiting")
        pay = stages["pay"]
        counts["ledger_attempts_over_1"] += pay.attempts > 1
        if crash and pay.attempts < 2:
            checker.fail(f"{name}: its ledger stage's process was to die after its writes, yet 1 attempt")
        # The sleep: durable (kept in the stage's waits) and never cut short.
        pause = stages["pause"]
        due = (pause.waits or {}).get("sleep:1")
        if not due:
            checker.fail(f"{name}: its pause never slept (waits {pause.waits})")
        else:
            lag = (pause.finished_at - parse_datetime(due)).total_seconds()
            if lag < 0:
                checker.fail(f"{name}: its sleep ended {-lag:.2f}s before its due time {due}")
            counts["sleeps"] += 1
            sleep_lags.append(lag)
        # The signal: one row, the client's, taken by the review.
        sent = signals.get(row.id, [])
        counts["signal_rows"] += len(sent)
        if len(sent) != 1:
            checker.fail(f"{name}: {len(sent)} signal rows (expected 1)")
        else:
            got = sent[0]
            if (got.name, got.idem_key, got.payload, got.sent_by_id) != (
                SIGNAL,
                plan_.key,
                plan_.payload,
                job.user.pk,
            ):
                checker.fail(
                    f"{name}: signal {(got.name, got.idem_key, got.payload, got.sent_by_id)}, expected "
                    f"{(SIGNAL, plan_.key, plan_.payload, job.user.pk)}"
                )
            if got.delivered_at is None:
                checker.fail(f"{name}: its signal was never delivered")
            counts["signals_early_before_review"] += got.sent_at < pause.finished_at
        if stages["review"].result != {"approved_by": plan_.payload["by"]}:
            checker.fail(f"{name}: review took {stages['review'].result}, the signal was {plan_.payload}")
        # The children: exactly CHILDREN, each COMPLETED, the ones the stage waited for.
        mine = children.get(row.id, [])
        counts["children"] += len(mine)
        counts["children_completed"] += sum(c.state == JobRow.State.COMPLETED for c in mine)
        if len(mine) != CHILDREN or sorted(c.payload.get("index") for c in mine) != list(range(CHILDREN)):
            checker.fail(
                f"{name}: {len(mine)} children {[(str(c.id), c.payload) for c in mine]} (expected {CHILDREN})"
            )
        for child in mine:
            if child.domain != CHILD or child.state != JobRow.State.COMPLETED or child.completed_at is None:
                checker.fail(f"{name}: child {child.id} ({child.domain}) is {child.state}")
            streamed.append((str(child.id), child.domain, child_seqs()))
        waited = (stages["fan_out"].result or {}).get("children") or []
        if sorted(c.get("job_id") for c in waited) != sorted(str(c.id) for c in mine) or any(
            c.get("state") != "COMPLETED" for c in waited
        ):
            checker.fail(
                f"{name}: its fan_out waited for {waited}, its children are {[str(c.id) for c in mine]}"
            )
    grandchildren = JobRow.objects.filter(parent_id__in=[child for child, _, _ in streamed]).count()
    if grandchildren:
        checker.fail(f"{grandchildren} jobs started by the children (expected none)")
    text = "\n".join(worker.log() for worker in checker.run.stack.workers)
    waits = _count(rf"Job ({UUID_RE}) WAITING", text)
    checker.figures["durable"] = {
        "keys": len(durable),
        **counts,
        "ledger_rows_expected": len(rows) * LEDGER_ROWS,
        "waiting_transitions": sum(waits.get(str(i), 0) for i in ids),
        "sleep_ended_after_due_s": (
            {"min": round(min(sleep_lags), 2), "max": round(max(sleep_lags), 2)} if sleep_lags else {}
        ),
        "detail_polls": sum(job.signalling.polls for job in durable if job.signalling),
    }
    return streamed


def check_signal_answers(checker: Checker, job: Job, counts: dict) -> None:
    """Under the client's key: one 202 (or none when the first was lost on its way), every
    other answer a replay of it; under another key: 409 signal-sent."""
    plan_ = job.signalling
    assert plan_ is not None
    counts["signals_sent_early"] += plan_.early and bool(plan_.answers)
    counts["signals_after_waiting_seen"] += plan_.seen_waiting and bool(plan_.answers)
    counts["signal_copies_sent"] += len(plan_.answers) + len(plan_.rival_answers)
    if plan_.answers:
        firsts = [a for a in plan_.answers if not a.replayed]
        lost = sum(a.answers_lost for a in plan_.answers)
        if len(firsts) != 1 and not (not firsts and lost):
            checker.fail(f"key {job.key}: {len(firsts)} signal answers were not replays (expected 1)")
        reference = min(firsts or plan_.answers, key=lambda a: a.at)
        body = _json(reference.body)
        if reference.status != 202 or body.get("signal") != SIGNAL or body.get("job_id") != job.job_id:
            checker.fail(f"key {job.key}: the signal got {reference.status} {reference.body[:300]!r}")
        for answer in plan_.answers:
            if (answer.status, answer.body) != (reference.status, reference.body):
                checker.fail(
                    f"key {job.key}: a copy of the signal got {answer.status} {answer.body[:200]!r}, the "
                    f"first {reference.status} {reference.body[:200]!r}"
                )
        counts["signal_replayed_202"] += sum(a.replayed and a.status == 202 for a in plan_.answers)
    for answer in plan_.rival_answers:
        if answer.status != 409 or _json(answer.body).get("type") != SIGNAL_SENT:
            checker.fail(
                f"key {job.key}: the signal under another key got {answer.status} {answer.body[:300]!r}"
            )
        else:
            counts["signal_other_key_409"] += 1


def _json(body: bytes) -> dict:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
