"""The job types of the chaos harness's durable workload (tests/e2e/durable.py), written as a
user writes them. Registered by the test settings (EVENTBUS["JOB_TYPES"]).

`durable_chaos`: an atomic stage writes LEDGER_ROWS ledger lines for the job, reporting each;
a stage sleeps (ctx.sleep) the payload's `sleep` seconds; a stage waits for the signal
`approve` (ctx.wait_for); a stage starts CHILDREN `durable_chaos_child` jobs and waits for
them (ctx.wait_children). With `crash_after_writes`, the atomic stage's first attempt kills its
own process after its writes, before the commit that records the stage finished: the retry
must leave the ledger lines once.
"""

from __future__ import annotations

import os
import signal

from eventbus.conf import eventbus_settings
from eventbus.jobtypes import JobType, Stage

DURABLE = "durable_chaos"
CHILD = "durable_chaos_child"
LEDGER_ROWS = 2
LEDGER_STAGE = "pay"
CHILDREN = 2
SIGNAL = "approve"
# Generous: a client sends the signal within seconds; the timeout only bounds one never sent.
REVIEW_TIMEOUT = 600


class DurableChaosJob(JobType):
    name = DURABLE
    description = "The chaos harness's durable stages: ledger lines, a sleep, a signal, children."
    example_payload = {"sleep": 1.5}
    stages = (
        Stage(LEDGER_STAGE, "Writing the ledger", atomic=True),
        Stage("pause", "Sleeping"),
        Stage("review", "Waiting for approval", signals=(SIGNAL,)),
        Stage("fan_out", "Running the children"),
    )

    def pay(self, ctx):
        from config.models import LedgerEntry  # the demo app's model: imported once apps are ready

        for line in range(LEDGER_ROWS):
            LedgerEntry.objects.create(job_id=ctx.job_id, stage=LEDGER_STAGE, amount=line + 1)
            ctx.report(done=line + 1, of=LEDGER_ROWS)
        if ctx.payload.get("crash_after_writes") and ctx.attempt == 1:
            # Dies as a SIGKILLed worker does, its writes made and not committed: Celery requeues
            # the task (WorkerLostError) and the next run is the stage's second attempt.
            os.kill(os.getpid(), signal.SIGKILL)
        return {"rows": LEDGER_ROWS}

    def pause(self, ctx):
        ctx.sleep(ctx.payload.get("sleep", 0))
        return {"slept": ctx.payload.get("sleep", 0)}

    def review(self, ctx):
        decision = ctx.wait_for(SIGNAL, timeout=REVIEW_TIMEOUT)
        return {"approved_by": decision.get("by") if isinstance(decision, dict) else None}

    def fan_out(self, ctx):
        for index in range(CHILDREN):
            ctx.start_child(CHILD, {"index": index})
        return {"children": [{"job_id": c["job_id"], "state": c["state"]} for c in ctx.wait_children()]}

    def outcome(self, results):
        return {
            "approved_by": results["review"]["approved_by"],
            "children": [child["state"] for child in results["fan_out"]["children"]],
        }


class DurableChaosChild(JobType):
    """A child of durable_chaos: one stage of simulated work (EVENTBUS["STAGE_SECONDS"])."""

    name = CHILD
    description = "A child job of durable_chaos."
    startable_by_api = False  # only its parent's stage starts one
    stages = (Stage("work", "Working"),)

    def work(self, ctx):
        from config.jobs import simulated_work

        simulated_work(eventbus_settings.STAGE_SECONDS)
        return {"index": ctx.payload.get("index")}


def durable_seqs() -> list[int]:
    """A durable_chaos job's seqs: a report per ledger line, one event for each other stage
    (it reports nothing), then the final."""
    pay, *others = DurableChaosJob.plan()
    firsts = [pay.first_seq + line for line in range(LEDGER_ROWS)]
    return [*firsts, *(planned.first_seq for planned in others), DurableChaosJob.final_seq()]


def child_seqs() -> list[int]:
    return [DurableChaosChild.plan()[0].first_seq, DurableChaosChild.final_seq()]
