"""The demo's job types, written with the toolkit's public API (eventbus.jobtypes), as any
project writes its own. Registered by EVENTBUS["JOB_TYPES"] in config.settings.base.

    scan: vision 10 -> rule 20 -> answer 30 -> reward 40 -> done 51
    chat: answer 30, 31, ... (one event per chunk of the answer, at most 10) -> done 51
    approval: request 10 -> review 20 (WAITING for the signal approve or reject) -> record 30 -> done 51

Their work is simulated: a scan stage sleeps EVENTBUS["STAGE_SECONDS"] (0 in the test suite),
and a chat answer, the whole of a chat job, as long as a scan's four stages together, spread
over its chunks so that the page shows it grow.

Payloads: scan reads no field; chat reads `prompt`, what its answer is about (whitespace
collapsed, first 200 characters); approval reads `amount`, what its ledger line records once
approved. Other fields are ignored.

An approval job waits for a person (its review stage, ctx.wait_for): the page's approve and
reject buttons, POST /api/jobs/<id>/signals/approve/ (or reject/), the admin's "Send a signal",
or eventbus.signal_job send the decision; no worker is held meanwhile. Its record stage is
atomic: its ledger line (config.models.LedgerEntry) is written once, with the write that records
the stage finished.
"""

from __future__ import annotations

import time

from eventbus.conf import eventbus_settings
from eventbus.jobtypes import InvalidPayload, JobType, Stage

MAX_CHUNKS = 10  # the answer's seq range, 30-39
# An approval's amount (a ledger line's IntegerField holds it), and how long its review waits
# for a decision before the job fails (StageTimeout): a forgotten one does not wait for ever.
MAX_AMOUNT = 1_000_000
REVIEW_TIMEOUT = 24 * 3600


def simulated_work(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


class ScanJob(JobType):
    name = "scan"
    description = "scan reads no payload field: its stages are simulated."
    stages = (
        Stage("vision", "Reading the image"),
        Stage("rule", "Applying the rules"),
        Stage("answer", "Writing the answer"),
        Stage("reward", "Scoring the answer"),
    )

    # Each stage: its simulated work; its one event (progress 20, 40, 60, 80) is the toolkit's.
    def vision(self, ctx):
        simulated_work(eventbus_settings.STAGE_SECONDS)
        return {"objects": 3}

    def rule(self, ctx):
        simulated_work(eventbus_settings.STAGE_SECONDS)
        return {"rules": 2}

    def answer(self, ctx):
        simulated_work(eventbus_settings.STAGE_SECONDS)
        return {"answer": "a simulated answer"}

    def reward(self, ctx):
        simulated_work(eventbus_settings.STAGE_SECONDS)
        return {"score": 1}


class ChatJob(JobType):
    name = "chat"
    description = 'chat reads "prompt": what its streamed answer is about.'
    example_payload = {"prompt": "exactly-once delivery"}
    # The seed's numbering: the answer range is 30-39, as in a scan.
    stages = (Stage("answer", "Answering", first_seq=30, width=MAX_CHUNKS),)

    def clean_payload(self, payload):
        prompt = payload.get("prompt", "")
        if not isinstance(prompt, str):
            raise InvalidPayload({"prompt": "must be a string"})
        return payload

    def answer(self, ctx):
        chunks = answer_chunks(ctx.payload.get("prompt", ""))
        pause = len(ScanJob.stages) * eventbus_settings.STAGE_SECONDS / len(chunks)
        for number, text in enumerate(chunks, start=1):
            simulated_work(pause)
            # Up to 90 over the chunks, strictly rising; the final event is 100.
            ctx.report(progress=90 * number // len(chunks), text=text)
        return {"answer": "".join(chunks)}


def answer_chunks(prompt: str) -> list[str]:
    """The simulated answer in at most MAX_CHUNKS chunks; concatenated, they are the answer."""
    prompt = " ".join(str(prompt).split())[:200].rstrip() or "nothing in particular"
    words = f"You asked about {prompt}. This is a simulated answer, streamed to you in chunks.".split(" ")
    size = -(-len(words) // MAX_CHUNKS)  # ceil: never more than MAX_CHUNKS chunks
    return [("" if i == 0 else " ") + " ".join(words[i : i + size]) for i in range(0, len(words), size)]


class ApprovalJob(JobType):
    name = "approval"
    description = (
        'approval reads "amount", then waits for your decision: its card shows approve and reject '
        "(or POST /api/jobs/<id>/signals/approve/); an approved amount goes in the ledger."
    )
    example_payload = {"amount": 100}
    stages = (
        Stage("request", "Requesting approval"),
        Stage("review", "Waiting for a decision", signals=("approve", "reject")),
        Stage("record", "Recording the decision", atomic=True),
    )

    def clean_payload(self, payload):
        amount = payload.get("amount", 0)
        if isinstance(amount, bool) or not isinstance(amount, int) or not 0 <= amount <= MAX_AMOUNT:
            raise InvalidPayload({"amount": f"must be a whole number from 0 to {MAX_AMOUNT}"})
        return payload

    def request(self, ctx):
        simulated_work(eventbus_settings.STAGE_SECONDS)
        return {"amount": ctx.payload.get("amount", 0)}

    def review(self, ctx):
        # Runs again from its start once the decision comes: nothing before the wait to repeat.
        decision, data = ctx.wait_for("approve", "reject", timeout=REVIEW_TIMEOUT)
        by = data.get("by") if isinstance(data, dict) else None  # code may send any JSON
        return {"decision": "approved" if decision == "approve" else "rejected", "by": by}

    def record(self, ctx):
        from config.models import LedgerEntry  # the demo app's model: imported once apps are ready

        approved = ctx.results["review"]["decision"] == "approved"
        amount = ctx.results["request"]["amount"] if approved else 0
        LedgerEntry.objects.create(job_id=ctx.job_id, stage="record", amount=amount)
        return {"recorded": amount}

    def outcome(self, results):
        return {"decision": results["review"]["decision"], "recorded": results["record"]["recorded"]}
