"""The demo's two job types, written with the toolkit's public API (eventbus.jobtypes), as
any project writes its own. Registered by EVENTBUS["JOB_TYPES"] in config.settings.base.

    scan: vision 10 -> rule 20 -> answer 30 -> reward 40 -> done 51
    chat: answer 30, 31, ... (one event per chunk of the answer, at most 10) -> done 51

Their work is simulated: a scan stage sleeps EVENTBUS["STAGE_SECONDS"] (0 in the test suite),
and a chat answer, the whole of a chat job, as long as a scan's four stages together, spread
over its chunks so that the page shows it grow.

Payloads: scan reads no field; chat reads `prompt`, what its answer is about (whitespace
collapsed, first 200 characters). Other fields are ignored.
"""

from __future__ import annotations

import time

from eventbus.conf import eventbus_settings
from eventbus.jobtypes import InvalidPayload, JobType, Stage

MAX_CHUNKS = 10  # the answer's seq range, 30-39


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
