"""The stage pipelines of each job domain: what a job does, as the events it publishes.

A pipeline is deterministic: run twice on the same payload it yields the same (stage, seq,
data) in the same order. That is what makes a re-run after a worker crash safe: it republishes
from the start and L1 drops every event the first run already published.

    scan: vision 10 -> rule 20 -> answer 30 -> reward 40 -> done 51
    chat: answer 30, 31, ... (one event per chunk of the answer, at most 10) -> done 51

The done stage publishes only the final seq 51 (FINAL_SEQ); 50 stays unused. Its data carries
the outcome: {"state": "COMPLETED" | "FAILED" | "TIMED_OUT", "final": true, ...}, so a client
watching the job learns from the stream alone that it ended, and how.

Each stage's work is simulated: it sleeps EVENTBUS["STAGE_SECONDS"] (0 in the test suite), and
a chat answer, the whole of a chat job, as long as a scan's four stages together.

Every event's data carries `progress`, a percentage that rises with every event and is 100 on
the final one: the page's bar shows the latest event's `progress`, so every event moves it.

Payloads: scan reads no field (its work is simulated); chat reads `prompt`, what its answer
is about (whitespace collapsed, first 200 characters). Other fields are ignored.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

from .conf import eventbus_settings
from .keys import FINAL_SEQ, seq_for

MAX_CHUNKS = 10  # the answer range holds seqs 30-39


@dataclass(frozen=True)
class Event:
    stage: str
    seq: int
    data: dict


def final_event(state: str, **data) -> Event:
    """The done event ending a job in `state` (COMPLETED, FAILED or TIMED_OUT)."""
    return Event("done", FINAL_SEQ, {"label": "Done", "progress": 100, "state": state, "final": True, **data})


class Pipeline:
    """A domain's stages. Subclasses implement `stage_events()`; `events()` adds the final event."""

    domain: str = ""
    sleep: Callable[[float], None] = staticmethod(time.sleep)

    def __init__(self, payload: dict | None = None, *, stage_seconds: float | None = None):
        self.payload = payload or {}
        self.stage_seconds = eventbus_settings.STAGE_SECONDS if stage_seconds is None else stage_seconds

    def events(self) -> Iterator[Event]:
        """Every event of the job in increasing seq; each is yielded once its work is done."""
        yield from self.stage_events()
        yield final_event("COMPLETED")

    def stage_events(self) -> Iterator[Event]:
        raise NotImplementedError("Pipeline subclasses must implement stage_events()")

    def work(self, seconds: float) -> None:
        """The simulated work of a stage (or of a part of one)."""
        if seconds > 0:
            self.sleep(seconds)


class ScanPipeline(Pipeline):
    domain = "scan"
    stages = (
        ("vision", "Reading the image"),
        ("rule", "Applying the rules"),
        ("answer", "Writing the answer"),
        ("reward", "Scoring the answer"),
    )

    def stage_events(self):
        for number, (stage, label) in enumerate(self.stages, start=1):
            self.work(self.stage_seconds)
            yield Event(stage, seq_for(stage, 0), {"label": label, "progress": 20 * number})


class ChatPipeline(Pipeline):
    """Streams a (simulated) answer in chunks, one event per chunk.

    The answer is the whole of a chat job, so it takes as long as a scan's four stages
    (ANSWER_STAGES x STAGE_SECONDS), spread evenly over its chunks. One STAGE_SECONDS for the
    whole answer made a chat job too quick to watch: the page's bar jumped straight to the end.
    An answer has 7 to 10 chunks, so no chunk takes longer than a stage, which is all the run
    lease (renewed per event, sized by STAGE_SECONDS) has to cover.
    """

    domain = "chat"
    answer_stages = len(ScanPipeline.stages)

    def stage_events(self):
        chunks = self.answer_chunks()
        for sub_seq, text in enumerate(chunks):
            self.work(self.answer_stages * self.stage_seconds / len(chunks))
            # Up to 90 over the chunks, strictly rising (at most 10 chunks); the final event is 100.
            progress = 90 * (sub_seq + 1) // len(chunks)
            data = {"label": "Answering", "text": text, "progress": progress}
            yield Event("answer", seq_for("answer", sub_seq), data)

    def answer_chunks(self) -> list[str]:
        prompt = " ".join(str(self.payload.get("prompt", "")).split())[:200].rstrip()
        prompt = prompt or "nothing in particular"
        words = f"You asked about {prompt}. This is a simulated answer, streamed to you in chunks.".split(" ")
        size = -(-len(words) // MAX_CHUNKS)  # ceil: never more than MAX_CHUNKS chunks
        # Concatenated in seq order, the chunks are the answer.
        return [("" if i == 0 else " ") + " ".join(words[i:i + size]) for i in range(0, len(words), size)]


PIPELINES: dict[str, type[Pipeline]] = {p.domain: p for p in (ScanPipeline, ChatPipeline)}


class UnknownPipeline(LookupError):
    pass


def pipeline_for(domain: str, payload: dict | None = None) -> Pipeline:
    try:
        return PIPELINES[domain](payload)
    except KeyError:
        raise UnknownPipeline(f"No pipeline for domain {domain!r}; known: {sorted(PIPELINES)}") from None
