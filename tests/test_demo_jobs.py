"""The demo's job types (config.jobs), run in memory with eventbus.testing.events_of."""

import pytest

from config import jobs as demo
from eventbus.testing import events_of

FINAL_SEQ = 51
pytestmark = pytest.mark.django_db


def test_scan_runs_its_stages_in_seq_order():
    assert [(stage, seq) for stage, seq, _ in events_of("scan")] == [
        ("vision", 10),
        ("rule", 20),
        ("answer", 30),
        ("reward", 40),
        ("done", FINAL_SEQ),
    ]


@pytest.mark.parametrize("prompt", ["", "hi", "why " * 500])
def test_chat_streams_the_answer_in_at_most_ten_chunks(prompt):
    events = events_of("chat", {"prompt": prompt})
    answer = [(seq, data) for stage, seq, data in events if stage == "answer"]
    assert 1 <= len(answer) <= demo.MAX_CHUNKS
    assert [seq for seq, _ in answer] == list(range(30, 30 + len(answer)))
    stage, seq, final = events[-1]
    assert (stage, seq, final["final"]) == ("done", FINAL_SEQ, True)
    assert "".join(data["text"] for _, data in answer).startswith("You asked about ")
    assert events == events_of("chat", {"prompt": prompt})  # deterministic


def test_each_scan_stage_does_its_work(monkeypatch, settings):
    settings.EVENTBUS = {**settings.EVENTBUS, "STAGE_SECONDS": 0.5}
    slept = []
    monkeypatch.setattr(demo, "simulated_work", slept.append)
    events_of("scan")
    assert slept == [0.5] * 4


@pytest.mark.parametrize(
    "domain,payload", [("scan", {}), ("chat", {"prompt": ""}), ("chat", {"prompt": "why " * 500})]
)
def test_every_event_carries_a_rising_progress_that_ends_at_100(domain, payload):
    # The page's bar shows each event's own progress: every event carries one, chat's answer
    # chunks included, so that the bar moves with every event and stops at 100 with the last.
    progress = [data["progress"] for _, _, data in events_of(domain, payload)]
    assert all(isinstance(p, int) and 0 < p <= 100 for p in progress), progress
    assert progress == sorted(set(progress)) and progress[-1] == 100


@pytest.mark.parametrize("prompt", ["", "hi", "exactly-once delivery", "why " * 500])
def test_in_development_a_chat_job_takes_seconds_chunk_by_chunk(monkeypatch, settings, prompt):
    # config.settings.dev makes a job slow enough to watch on the page: the chat answer takes
    # as long as a scan's four stages, in one step per chunk.
    from config.settings import dev

    seconds = dev.EVENTBUS["STAGE_SECONDS"]
    settings.EVENTBUS = {**settings.EVENTBUS, "STAGE_SECONDS": seconds}
    slept = []
    monkeypatch.setattr(demo, "simulated_work", slept.append)
    chunks = [e for e in events_of("chat", {"prompt": prompt}) if e[0] == "answer"]
    assert len(slept) == len(chunks) >= 5
    assert 5 <= sum(slept) <= 8
    assert sum(slept) == pytest.approx(4 * seconds)  # as long as a scan job
    # No step outlasts a stage.
    assert max(slept) <= seconds


def test_chat_refuses_a_prompt_that_is_not_text(api_client):
    response = api_client.post(
        "/api/jobs/",
        {"domain": "chat", "payload": {"prompt": 42}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="bad-prompt",
    )
    assert response.status_code == 400
    assert response.json()["errors"]["payload"] == {"prompt": "must be a string"}
