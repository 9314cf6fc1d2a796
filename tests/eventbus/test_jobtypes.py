"""The public job-type API: declarations, seqs from stages, registration, the jobs API, and
effectively-once stages (a re-run skips finished stages), in process against real Redis and a
real database. The same with a real worker SIGKILLed mid-stage is in test_tasks_worker.py."""

import json

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from eventbus.bus.keys import JobKeys
from eventbus.job import runs
from eventbus.jobtypes import (
    JobType,
    Stage,
    UnknownJobType,
    domains,
    job_type,
    register,
    registry,
    shard_count,
)
from eventbus.models import Job, StageRecord
from eventbus.testing import events_of

from .helpers import job_events
from .jobtypes import StagedJob, lines

State = Job.State


@pytest.fixture(autouse=True)
def own_registrations():
    """Types a test registers are gone after it."""
    from eventbus import jobtypes

    before = dict(jobtypes._DECORATED)
    yield
    jobtypes._DECORATED.clear()
    jobtypes._DECORATED.update(before)
    jobtypes._forget()


ONE_STAGE = (Stage("a"),)


def declare(name="t", stages=ONE_STAGE, **methods):
    methods.setdefault("a", lambda self, ctx: None)
    return type("Declared", (JobType,), {"name": name, "stages": stages, **methods})


# Declarations -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "no spaces"}, "identifier"),
        ({"stages": ()}, "at least one Stage"),
        ({"stages": (Stage("a"), Stage("a"))}, "repeat"),
        ({"stages": (Stage("a"), Stage("b"))}, "needs a method b"),
        ({"stages": (Stage("a", first_seq=30), Stage("b", first_seq=20))}, "inside the range before it"),
    ],
)
def test_a_declaration_the_toolkit_cannot_run_is_refused_at_registration(kwargs, message):
    if "needs a method" not in message:
        kwargs["b"] = lambda self, ctx: None
    with pytest.raises(ImproperlyConfigured, match=message):
        register(declare(**kwargs))


def test_a_stage_named_done_or_not_an_identifier_is_refused():
    for name in ("done", "two words"):
        with pytest.raises(ImproperlyConfigured):
            Stage(name)


@pytest.mark.django_db  # StagedJob's second stage calls an @idempotent function
def test_seqs_come_from_the_declared_stages():
    four = declare(stages=tuple(Stage(n) for n in "abcd"), **{n: lambda self, ctx: None for n in "abcd"})
    assert [p.first_seq for p in four.plan()] == [10, 20, 30, 40] and four.final_seq() == 51
    six = declare(stages=tuple(Stage(n) for n in "abcdef"), **{n: lambda self, ctx: None for n in "abcdef"})
    assert [p.first_seq for p in six.plan()] == [10, 20, 30, 40, 50, 60] and six.final_seq() == 71
    wide = declare(stages=(Stage("a", width=25), Stage("b")), b=lambda self, ctx: None)
    assert [p.first_seq for p in wide.plan()] == [10, 35] and wide.final_seq() == 51
    assert [(s, seq) for s, seq, _ in events_of(StagedJob, {"log": "/dev/null"})] == [
        ("first", 10),
        ("second", 20),
        ("second", 21),
        ("third", 30),
        ("done", 51),
    ]


def test_a_stage_that_reports_more_than_its_width_is_stopped():
    def chatty(self, ctx):
        for i in range(11):
            ctx.report(done=i, of=11)

    with pytest.raises(ValueError, match="more than 10 events"):
        events_of(declare(a=chatty))


def test_two_types_of_one_name_are_refused():
    register(declare(name="scan"))
    with pytest.raises(ImproperlyConfigured, match="Two job types are named 'scan'"):
        registry()


def test_a_type_both_decorated_and_in_the_setting_is_one_type(settings):
    """@register runs while its module is imported: it must not import the setting's modules
    (which may be that very module) to check names."""
    settings.EVENTBUS = {"JOB_TYPES": ("tests.eventbus.decorated_jobs.Decorated",)}
    import tests.eventbus.decorated_jobs as module

    assert job_type("decorated") is module.Decorated


def test_registered_by_decorator_or_by_setting(settings):
    assert {"scan", "chat", "staged"} <= set(registry())
    settings.EVENTBUS = {"JOB_TYPES": ()}
    with pytest.raises(UnknownJobType):
        job_type("scan")
    decorated = register(declare(name="decorated_type"))
    assert job_type("decorated_type") is decorated


def test_domains_and_shard_counts_follow_the_setting_and_registrations(settings):
    """The registry's shard counts are cached: dropped when EVENTBUS changes or a type registers."""
    assert shard_count("scan") == job_type("scan").shards and "scan" in domains()
    settings.EVENTBUS = {**settings.EVENTBUS, "DOMAINS": {"scan": 2, "plain": 3}}
    assert (shard_count("scan"), shard_count("plain")) == (2, 3)
    assert domains() == [*registry(), "plain"]
    with pytest.raises(UnknownJobType, match="'late'"):
        shard_count("late")
    register(declare(name="late", shards=5))
    assert shard_count("late") == 5 and "late" in domains()


# The jobs API ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_jobs_api_accepts_every_registered_type_and_refuses_others(api_client):
    accepted = api_client.post(
        "/api/jobs/",
        {"domain": "staged", "payload": {"log": "/dev/null"}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="staged-1",
    )
    assert accepted.status_code == 201, accepted.content
    refused = api_client.post("/api/jobs/", {"domain": "nope"}, format="json", HTTP_IDEMPOTENCY_KEY="nope-1")
    assert refused.status_code == 400 and refused["Content-Type"] == "application/problem+json"
    assert "staged" in json.dumps(refused.json()["errors"]["domain"])


# Effectively-once stages ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_rerun_skips_finished_stages_and_reuses_their_results_and_events(
    redis_client, make_job, tmp_path, monkeypatch
):
    log_path = str(tmp_path / "log")
    job = make_job("staged", {"log": log_path})
    real_third = StagedJob.third

    def crash_once(self, ctx):  # Redis goes away in the third stage, on the first run only
        if ctx.attempt == 1:
            raise redis.ConnectionError("Redis went away")
        return real_third(self, ctx)

    monkeypatch.setattr(StagedJob, "third", crash_once)
    with pytest.raises(redis.ConnectionError):
        runs.run(str(job.id), fail_on_transient=False)
    assert runs.run(str(job.id)) == State.COMPLETED
    key = f"{job.id}:second"
    assert lines(log_path) == [
        "first",
        "second attempt 1 after {'n': 1}",
        f"charge {key}",
        "second charged",
        "third",
    ]  # the third stage's work ran on its second attempt only; the first two ran once
    records = {r.stage: r for r in StageRecord.objects.filter(job=job)}
    assert {name: r.attempts for name, r in records.items()} == {"first": 1, "second": 1, "third": 2}
    assert records["second"].result == {"receipt": {"charged": 5}}
    assert [seq for _stage, seq, _data in records["second"].events] == [20, 21]
    assert job_events(redis_client, "staged", job.id) == [
        ("first", 10),
        ("second", 20),
        ("second", 21),
        ("third", 30),
        ("done", 51),
    ]


@pytest.mark.django_db(transaction=True)
def test_recorded_events_restore_a_stream_that_lost_them(redis_client, make_job, tmp_path, monkeypatch):
    """Redis lost everything between two runs: the finished stages' recorded events are
    published again, and only the unfinished stage runs."""
    log_path = str(tmp_path / "log")
    job = make_job("staged", {"log": log_path})
    monkeypatch.setattr(StagedJob, "third", lambda self, ctx: (_ for _ in ()).throw(redis.TimeoutError()))
    with pytest.raises(redis.TimeoutError):
        runs.run(str(job.id), fail_on_transient=False)
    redis_client.flushdb()
    monkeypatch.undo()
    assert runs.run(str(job.id)) == State.COMPLETED
    assert lines(log_path).count("first") == 1 and lines(log_path).count("third") == 1
    assert job_events(redis_client, "staged", job.id) == [
        ("first", 10),
        ("second", 20),
        ("second", 21),
        ("third", 30),
        ("done", 51),
    ]


@pytest.mark.django_db
def test_job_failed_ends_the_job_with_its_reason(redis_client, make_job, tmp_path):
    job = make_job("staged", {"log": str(tmp_path / "log"), "fail": True})
    assert runs.run(str(job.id)) == State.FAILED
    final = [
        json.loads(f[b"data"])
        for _, f in redis_client.xrange(JobKeys("staged", str(job.id)).stream)
        if f[b"job_id"].decode() == str(job.id) and f[b"stage"] == b"done"
    ]
    assert final == [
        {
            "label": "Done",
            "progress": 100,
            "state": "FAILED",
            "final": True,
            "error": {"stage": "second", "type": "JobFailed", "message": "refused by the payload"},
            "code": 7,
        }
    ]


@pytest.mark.django_db
def test_a_stage_result_that_is_not_json_fails_the_job_clearly(redis_client, make_job, caplog):
    broken = register(declare(name="not_json", a=lambda self, ctx: object()))
    job = make_job(broken.name)
    assert runs.run(str(job.id)) == State.FAILED
    assert "must return JSON-serialisable data" in caplog.text


def nul_event(self, ctx):
    ctx.report(note="a\u0000b")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "work",
    [lambda self, ctx: {"note": "a\u0000b"}, lambda self, ctx: {"a\u0000": 1}, nul_event],
    ids=["result", "key", "event"],
)
def test_a_nul_in_what_a_stage_records_fails_its_job_alike_on_every_database(
    redis_client, make_job, api_client, work
):
    """PostgreSQL's jsonb cannot store a NUL: it failed the job there with a DataError and
    completed it on SQLite. Now it is the same clear failure on both."""
    job_type = register(declare(name="nul", a=work))
    job = make_job(job_type.name)
    assert runs.run(str(job.id)) == State.FAILED
    error = api_client.get(f"/api/jobs/{job.id}/").json()["error"]
    assert error["stage"] == "a" and error["type"] == "TypeError" and "NUL" in error["message"]


@pytest.mark.django_db
def test_a_backslash_before_u0000_is_no_nul(redis_client, make_job):
    """What a JSON text spells \\u0000 with an escaped backslash is text, not a NUL: recorded."""
    job_type = register(
        declare(name="backslash", a=lambda self, ctx: {"path": "C:\\u0000", "odd": "\\\\u0000"})
    )
    job = make_job(job_type.name)
    assert runs.run(str(job.id)) == State.COMPLETED
    assert StageRecord.objects.get(job=job).result == {"path": "C:\\u0000", "odd": "\\\\u0000"}


def surrogate_event(self, ctx):
    ctx.report(note="a\ud800b")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "work",
    [lambda self, ctx: {"note": "a\udc00"}, lambda self, ctx: {"\ud800": 1}, surrogate_event],
    ids=["result", "key", "event"],
)
def test_a_lone_surrogate_in_what_a_stage_records_fails_its_job_clearly(
    redis_client, make_job, api_client, work
):
    """SQLite stored it, then the job's detail and admin page failed to encode it (a 500 for
    ever): the stage fails instead, and the job's detail says why."""
    job_type = register(declare(name="surrogate", a=work))
    job = make_job(job_type.name)
    assert runs.run(str(job.id)) == State.FAILED
    error = api_client.get(f"/api/jobs/{job.id}/").json()["error"]
    assert error["stage"] == "a" and error["type"] == "TypeError" and "lone surrogate" in error["message"]
