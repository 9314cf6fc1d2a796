"""Periodic schedules without a scheduler process: their ticks (cron in UTC and in a TIME_ZONE
with clock changes, intervals since the epoch), the missed-tick policies and the first tick, one
pass at a time at a given `now`, what refuses a bad declaration (schedule() and the system check)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from eventbus import schedule
from eventbus.djangotasks import compat, schedules
from eventbus.djangotasks.schedules import CATCH_UP, Schedule, declared_schedules, from_settings, run_pass
from eventbus.models import Job
from tests.tasks import tasks

SCOPE = "schedule:eventbus:default"


def at(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)  # type: ignore[misc,arg-type]


def iso(*fields) -> str:
    return at(*fields).isoformat()


def declared(name="beat", **spec) -> Schedule:
    return from_settings("default", name, {"task": "tests.tasks.tasks.add", "args": [1, 2], **spec})


def ticks_of(name="beat") -> list[str]:
    """The ticks enqueued for the schedule: its jobs' keys, the name taken off."""
    keys = Job.objects.filter(scope=SCOPE, idem_key__startswith=f"{name}:").values_list("idem_key", flat=True)
    return sorted(key.removeprefix(f"{name}:") for key in keys)


@pytest.fixture
def no_code_schedules(monkeypatch):
    """schedule() declares into a registry of its own for the test."""
    monkeypatch.setattr(schedules, "_DECLARED", {})


def with_schedules(settings, entries) -> None:
    settings.TASKS = {
        "default": {
            **settings.TASKS["default"],
            "OPTIONS": {"SCHEDULES": entries},
        }
    }


# Ticks -----------------------------------------------------------------------------------------


def test_an_interval_ticks_at_its_multiples_since_the_epoch():
    minutely = declared(every=60)
    assert minutely.latest_tick(at(2025, 1, 6, 10, 0, 30)) == at(2025, 1, 6, 10, 0)
    assert minutely.latest_tick(at(2025, 1, 6, 10, 1)) == at(2025, 1, 6, 10, 1)  # a tick is its own latest
    assert minutely.next_tick(at(2025, 1, 6, 10, 1)) == at(2025, 1, 6, 10, 2)  # strictly after
    assert minutely.ticks_between(at(2025, 1, 6, 10, 0), at(2025, 1, 6, 10, 3)) == [
        at(2025, 1, 6, 10, 1),
        at(2025, 1, 6, 10, 2),
        at(2025, 1, 6, 10, 3),
    ]
    # Whole multiples of 7 hours since 1970-01-01 00:00 UTC (482256 hours before 2025-01-06,
    # 5 past a multiple of 7), not of the start of the day.
    seven_hours = declared(every=timedelta(hours=7))
    assert seven_hours.next_tick(at(2025, 1, 6)) == at(2025, 1, 6, 2)
    assert declared(every=0.25).next_tick(at(2025, 1, 6, 0, 0, 0, 300_000)) == at(
        2025, 1, 6, 0, 0, 0, 500_000
    )
    assert declared(every=1).ticks_between(at(2025, 1, 6), at(2025, 1, 6, 1), limit=3) == [
        at(2025, 1, 6, 0, 59, 58),
        at(2025, 1, 6, 0, 59, 59),
        at(2025, 1, 6, 1),
    ]


@pytest.mark.parametrize(
    "cron, after, expected",
    [
        ("0 3 * * *", at(2025, 1, 6, 2, 59), at(2025, 1, 6, 3)),
        ("0 3 * * *", at(2025, 1, 6, 3), at(2025, 1, 7, 3)),
        ("*/15 * * * *", at(2025, 1, 6, 10, 7), at(2025, 1, 6, 10, 15)),
        ("59 23 31 12 *", at(2025, 1, 6), at(2025, 12, 31, 23, 59)),
        ("0 0 29 2 *", at(2025, 1, 6), at(2028, 2, 29)),
        ("30 8 * * mon-fri", at(2025, 1, 10, 9), at(2025, 1, 13, 8, 30)),  # Friday to Monday
        ("0 12 * jun sun", at(2025, 1, 6), at(2025, 6, 1, 12)),  # Sunday is 0, or sun
        # Both day fields restricted: either day runs, as in cron (the 1st, and each Monday).
        ("0 9 1 * 1", at(2025, 9, 29, 10), at(2025, 10, 1, 9)),
        ("0 9 1 * 1", at(2025, 10, 1, 10), at(2025, 10, 6, 9)),
        # One starts with `*`: both must match (a Monday the 1st: September 2025, then December).
        ("0 9 1 * */1", at(2025, 9, 2), at(2025, 10, 1, 9)),
    ],
)
def test_a_cron_expression_ticks_in_utc(cron, after, expected):
    assert declared(cron=cron).next_tick(after) == expected
    assert declared(cron=cron).latest_tick(expected) == expected
    assert declared(cron=cron).latest_tick(expected - timedelta(microseconds=1)) <= after


def test_a_cron_expression_ticks_in_the_time_zone(settings):
    settings.TIME_ZONE = "Europe/Paris"
    nightly = declared(cron="0 3 * * *")
    assert nightly.next_tick(at(2025, 1, 6)) == at(2025, 1, 6, 2)  # 03:00 CET
    assert nightly.next_tick(at(2025, 7, 6)) == at(2025, 7, 6, 1)  # 03:00 CEST
    assert nightly.key(at(2025, 7, 6, 1)) == "beat:2025-07-06T01:00:00+00:00"  # keys in UTC
    settings.TIME_ZONE = "America/New_York"
    assert nightly.next_tick(at(2025, 1, 6)) == at(2025, 1, 6, 8)


def test_the_days_the_clocks_change(settings):
    settings.TIME_ZONE = "Europe/Paris"  # 2025-03-30 02:00 -> 03:00; 2025-10-26 03:00 -> 02:00
    at_2_30 = declared(cron="30 2 * * *")
    # Skipped: shifted forward by the gap, 03:30 CEST.
    assert at_2_30.next_tick(at(2025, 3, 29, 12)) == at(2025, 3, 30, 1, 30)
    # Twice: once, at its first occurrence (02:30 CEST).
    assert at_2_30.next_tick(at(2025, 10, 25, 12)) == at(2025, 10, 26, 0, 30)
    assert at_2_30.next_tick(at(2025, 10, 26, 0, 30)) == at(2025, 10, 27, 1, 30)
    # Every hour's: by the real time, through both copies of the repeated hour.
    half_hourly = declared(cron="*/30 * * * *")
    fall = half_hourly.ticks_between(at(2025, 10, 25, 23, 15), at(2025, 10, 26, 2, 15))
    assert fall == [at(2025, 10, 25, 23, 30) + timedelta(minutes=30 * i) for i in range(6)]
    spring = half_hourly.ticks_between(at(2025, 3, 30, 0, 15), at(2025, 3, 30, 1, 45))
    assert spring == [
        at(2025, 3, 30, 0, 30),
        at(2025, 3, 30, 1),
        at(2025, 3, 30, 1, 30),
    ]  # 01:30 CET, 03:00 CEST...


def test_a_tick_is_keyed_by_the_name_and_its_utc_time_in_the_backends_scope():
    beat = declared(every=1)
    assert beat.scope == SCOPE
    assert beat.key(datetime(2025, 1, 6, 11, tzinfo=timedelta_zone(1))) == "beat:2025-01-06T10:00:00+00:00"
    assert (
        declared(every=0.5).key(at(2025, 1, 6, 10, 0, 0, 500_000)) == "beat:2025-01-06T10:00:00.500000+00:00"
    )


def timedelta_zone(hours):
    from datetime import timezone

    return timezone(timedelta(hours=hours))


# Passes: the first tick and the missed ones --------------------------------------------------


@pytest.mark.django_db
def test_a_new_schedule_runs_no_tick_from_before_it_was_first_seen():
    beat = declared(every=60)  # missed="latest"
    watches: dict = {}
    assert run_pass([beat], now=at(2025, 1, 6, 10, 0, 30), watches=watches) == []
    assert run_pass([beat], now=at(2025, 1, 6, 10, 0, 50), watches=watches) == []
    [tick] = run_pass([beat], now=at(2025, 1, 6, 10, 1, 0, 200_000), watches=watches)
    assert tick.created and tick.at == at(2025, 1, 6, 10, 1)
    assert ticks_of() == [iso(2025, 1, 6, 10, 1)]
    job = Job.objects.get(pk=tick.result_id)
    assert job.owner is None and job.domain == "task"
    assert job.payload["task"] == "tests.tasks.tasks.add" and job.payload["args"] == [1, 2]
    assert job.payload["backend"] == "default"


@pytest.mark.django_db
def test_a_running_scheduler_enqueues_every_tick_even_between_its_passes():
    beat = declared(every=1)
    watches: dict = {}
    run_pass([beat], now=at(2025, 1, 6, 10, 0, 0, 500_000), watches=watches)
    ticks = run_pass([beat], now=at(2025, 1, 6, 10, 0, 5, 100_000), watches=watches)
    assert [t.at.second for t in ticks] == [1, 2, 3, 4, 5]
    assert run_pass([beat], now=at(2025, 1, 6, 10, 0, 5, 900_000), watches=watches) == []
    assert len(ticks_of()) == 5


@pytest.mark.django_db
@pytest.mark.parametrize("missed", ["latest", "skip"])
def test_ticks_missed_while_no_scheduler_ran(missed):
    beat = declared(every=60, missed=missed)
    first: dict = {}
    run_pass([beat], now=at(2025, 1, 6, 10, 0, 30), watches=first)
    run_pass([beat], now=at(2025, 1, 6, 10, 1, 0, 100_000), watches=first)
    assert ticks_of() == [iso(2025, 1, 6, 10, 1)]
    # Stopped at 10:01:10; started again (a memory of its own) at 10:30:20.
    again: dict = {}
    ticks = run_pass([beat], now=at(2025, 1, 6, 10, 30, 20), watches=again)
    if missed == "latest":  # the latest missed tick, once, at once
        assert [(t.at, t.created) for t in ticks] == [(at(2025, 1, 6, 10, 30), True)]
    else:
        assert ticks == []
    ticks = run_pass([beat], now=at(2025, 1, 6, 10, 31, 0, 100_000), watches=again)
    assert [t.at for t in ticks] == [at(2025, 1, 6, 10, 31)]  # the next tick, either way
    missed_ticks = [iso(2025, 1, 6, 10, 30)] if missed == "latest" else []
    assert ticks_of() == [iso(2025, 1, 6, 10, 1), *missed_ticks, iso(2025, 1, 6, 10, 31)]


@pytest.mark.django_db
@pytest.mark.parametrize("missed", ["latest", "skip"])
def test_a_scheduler_stalled_past_catch_up_counts_the_late_ticks_missed(missed):
    every_five = declared(every=300, missed=missed)
    watches: dict = {}
    run_pass([every_five], now=at(2025, 1, 6, 10, 0, 1), watches=watches)  # new: first seen
    # Stalled from 10:00:01 to 10:16:40: the ticks 10:05, 10:10 and 10:15 are all late.
    assert timedelta(minutes=1, seconds=40) > CATCH_UP
    ticks = run_pass([every_five], now=at(2025, 1, 6, 10, 16, 40), watches=watches)
    assert [t.at for t in ticks] == ([at(2025, 1, 6, 10, 15)] if missed == "latest" else [])
    # Stalled again, with a tick on time: it runs, the late ones do not (either way).
    ticks = run_pass([every_five], now=at(2025, 1, 6, 10, 30, 30), watches=watches)
    assert [t.at for t in ticks] == [at(2025, 1, 6, 10, 30)]


@pytest.mark.django_db
def test_two_schedulers_enqueue_each_tick_once():
    beat = declared(every=60)
    one: dict = {}
    two: dict = {}
    for watches in (one, two):
        run_pass([beat], now=at(2025, 1, 6, 10, 0, 30), watches=watches)
    [first] = run_pass([beat], now=at(2025, 1, 6, 10, 1, 0, 100_000), watches=one)
    [second] = run_pass([beat], now=at(2025, 1, 6, 10, 1, 0, 200_000), watches=two)
    assert (first.created, second.created) == (True, False)
    assert first.result_id == second.result_id
    assert ticks_of() == [iso(2025, 1, 6, 10, 1)]


@pytest.mark.django_db
def test_a_cron_schedule_in_the_time_zone_enqueues_its_tick(settings):
    settings.TIME_ZONE = "Asia/Tokyo"
    nightly = declared("nightly", cron="0 3 * * *", kwargs={"b": 2}, args=[1])
    watches: dict = {}
    run_pass([nightly], now=at(2025, 1, 6, 17), watches=watches)  # 02:00 in Tokyo
    [tick] = run_pass([nightly], now=at(2025, 1, 6, 18, 0, 1), watches=watches)
    assert ticks_of("nightly") == [iso(2025, 1, 6, 18)]
    assert Job.objects.get(pk=tick.result_id).payload["kwargs"] == {"b": 2}
    assert watches[nightly.id].upcoming == at(2025, 1, 7, 18)


@pytest.mark.django_db
def test_the_task_keeps_its_queue_and_priority(no_code_schedules):
    report = schedule("report", tasks.report, every=60, args=["daily"])
    urgent = schedule("urgent", tasks.add.using(priority=7), every=60, args=[1, 1])
    watches: dict = {}
    run_pass([report, urgent], now=at(2025, 1, 6, 10, 0, 30), watches=watches)
    enqueued = run_pass([report, urgent], now=at(2025, 1, 6, 10, 1, 1), watches=watches)
    jobs = {t.schedule.name: Job.objects.get(pk=t.result_id) for t in enqueued}
    assert (jobs["report"].queue, jobs["report"].payload["queue_name"]) == ("reports", "reports")
    assert (jobs["urgent"].queue, jobs["urgent"].priority) == ("", 7)
    assert compat.task_backends["default"].get_result(enqueued[0].result_id).args == ["daily"]


@pytest.mark.django_db
def test_a_refused_tick_leaves_the_other_schedules_alone(caplog):
    beat = declared(every=60, args=[1, 2])
    watches: dict = {}
    run_pass([beat], now=at(2025, 1, 6, 10, 0, 30), watches=watches)
    run_pass([beat], now=at(2025, 1, 6, 10, 1, 1), watches=watches)
    # The same tick's key, now with other arguments (the schedule changed): refused, logged.
    changed, other = declared(every=60, args=[3, 4]), declared("other", every=60)
    retry: dict = {}
    with caplog.at_level(logging.ERROR, "eventbus"):
        ticks = run_pass([changed, other], now=at(2025, 1, 6, 10, 1, 30), watches=retry)
    assert [t.schedule.name for t in ticks] == []  # "other" is new: nothing yet
    assert "Schedule 'beat': its tick 2025-01-06T10:01:00+00:00 was refused" in caplog.text
    assert [
        t.schedule.name for t in run_pass([changed, other], now=at(2025, 1, 6, 10, 2, 1), watches=retry)
    ] == [
        "beat",
        "other",
    ]


@pytest.mark.django_db
def test_run_scheduler_burst_runs_one_pass(settings, no_code_schedules):
    with_schedules(settings, {"beat": {"task": "tests.tasks.tasks.add", "every": 3600, "args": [1, 2]}})
    out = StringIO()
    call_command("run_scheduler", "--burst", stdout=out)
    assert out.getvalue() == "Enqueued 0 tick(s).\n" and ticks_of() == []  # new: nothing before it
    # Once it has run, a scheduler's first pass runs its latest missed tick at once.
    [beat] = declared_schedules()
    beat.enqueue(at(2025, 1, 6, 10))
    call_command("run_scheduler", "--burst", stdout=out)
    assert out.getvalue().endswith("Enqueued 1 tick(s).\n")
    assert len(ticks_of()) == 2


# Declaring ----------------------------------------------------------------------------------------


def test_schedule_declares_in_code(settings, no_code_schedules):
    with_schedules(
        settings, {"nightly": {"task": "tests.tasks.tasks.report", "cron": "0 3 * * *", "args": ["x"]}}
    )
    beat = schedule("beat", tasks.add, every=timedelta(minutes=1), args=(1, 2), missed="skip")
    assert (beat.alias, beat.every, beat.args, beat.kwargs, beat.missed) == (
        "default",
        timedelta(minutes=1),
        [1, 2],
        {},
        "skip",
    )
    assert schedule("beat", tasks.add, every=60, args=[1, 2], missed="skip") == beat  # again: the same
    assert [(s.name, s.task.module_path) for s in declared_schedules()] == [
        ("nightly", "tests.tasks.tasks.report"),
        ("beat", "tests.tasks.tasks.add"),
    ]
    with pytest.raises(ValueError, match="'beat': already declared for the backend 'default'"):
        schedule("beat", tasks.add, every=30, args=[1, 2])
    with pytest.raises(ValueError, match=r"'nightly': already declared in TASKS\['default'\]"):
        schedule("nightly", tasks.report, cron="0 3 * * *", args=["x"])


def test_schedule_is_exported_from_eventbus():
    import eventbus

    assert eventbus.schedule is schedules.schedule


@pytest.mark.parametrize(
    "call, refused",
    [
        ({}, "give exactly one of 'cron' and 'every'"),
        ({"cron": "0 3 * * *", "every": 60}, "give exactly one of 'cron' and 'every'"),
        ({"cron": "0 3 * *"}, "is not a cron expression of 5 fields"),
        ({"cron": "61 * * * *"}, "is not a valid cron expression: Invalid end range: 61 > 59"),
        ({"cron": "0 0 30 2 *"}, "never ticks"),
        ({"every": 0}, "'every' is 0: a number of seconds"),
        ({"every": -5}, "'every' is -5"),
        ({"every": timedelta(0)}, "'every' is datetime.timedelta(0)"),
        ({"every": "60"}, "'every' is '60'"),
        ({"every": True}, "'every' is True"),
        ({"every": 60, "missed": "all"}, "'missed' is 'all', not one of ('latest', 'skip')"),
        ({"every": 60, "args": [object()]}, "A task's arguments must be JSON"),
        ({"every": 60, "kwargs": [1]}, "'args' is a list and 'kwargs' a dict"),
    ],
)
def test_schedule_refuses_a_bad_declaration_naming_it(no_code_schedules, call, refused):
    with pytest.raises(ValueError, match="Schedule 'beat': ") as caught:
        schedule("beat", tasks.add, **call)
    assert refused in str(caught.value)
    assert schedules._DECLARED == {}


@pytest.mark.parametrize("name", ["", "x" * 201, "caf\u00e9", None])
def test_schedule_refuses_a_bad_name(no_code_schedules, name):
    with pytest.raises(ValueError, match="name"):
        schedule(name, tasks.add, every=60)


def test_schedule_refuses_what_is_not_a_task(no_code_schedules):
    with pytest.raises(ValueError, match="not a django.tasks task"):
        schedule("beat", tasks.add.func, every=60)


# The system check ----------------------------------------------------------------------------------


def check(settings, entries) -> list:
    with_schedules(settings, entries)
    return compat.task_backends["default"].check()


def test_good_schedules_pass_the_check(settings):
    assert (
        check(
            settings,
            {
                "nightly": {"task": "tests.tasks.tasks.report", "cron": "0 3 * * mon-fri", "args": ["n"]},
                "heartbeat": {
                    "task": "tests.tasks.tasks.add",
                    "every": 60,
                    "missed": "skip",
                    "kwargs": {"a": 1, "b": 2},
                },
                "slow": {
                    "task": "tests.tasks.tasks.add",
                    "every": timedelta(hours=1),
                    "args": [1, 2],
                    "kwargs": None,
                },
            },
        )
        == []
    )


@pytest.mark.parametrize(
    "entry, expected",
    [
        (
            {"task": "tests.tasks.tasks.add", "every": 60, "when": "now"},
            [("eventbus.E022", "fields a schedule does not know: ['when']")],
        ),
        ("tests.tasks.tasks.add", [("eventbus.E022", "its entry is str, not a dict")]),
        ({"every": 60}, [("eventbus.E023", "it has no 'task'")]),
        ({"task": "tests.tasks.nowhere.add", "every": 60}, [("eventbus.E023", "cannot be imported")]),
        ({"task": "tests.tasks.tasks.Path", "every": 60}, [("eventbus.E023", "is not a django.tasks task")]),
        ({"task": "tests.tasks.tasks.add"}, [("eventbus.E024", "exactly one of 'cron' and 'every'")]),
        ({"task": "tests.tasks.tasks.add", "cron": "every day"}, [("eventbus.E025", "5 fields")]),
        ({"task": "tests.tasks.tasks.add", "every": -1}, [("eventbus.E026", "'every' is -1")]),
        (
            {"task": "tests.tasks.tasks.add", "every": 60, "missed": "first"},
            [("eventbus.E027", "'missed' is 'first'")],
        ),
        (
            {"task": "tests.tasks.tasks.add", "every": 60, "args": "1, 2"},
            [("eventbus.E028", "'args' is a list")],
        ),
        (
            {"task": "tests.tasks.tasks.nope", "cron": "* * * * * *", "missed": None},
            [
                ("eventbus.E023", "cannot be imported"),
                ("eventbus.E025", "5 fields"),
                ("eventbus.E027", "'missed' is None"),
            ],
        ),
    ],
)
def test_the_check_names_the_schedule_and_what_is_wrong(settings, entry, expected):
    errors = check(settings, {"beat": entry})
    assert [error.id for error in errors] == [check_id for check_id, _ in expected]
    for error, (_, what) in zip(errors, expected):
        assert error.msg.startswith("Schedule 'beat': ") and what in error.msg, error.msg
        assert "TASKS['default']['OPTIONS']['SCHEDULES']" in error.msg and error.hint


def test_the_check_refuses_a_task_the_backend_refuses(settings):
    settings.TASKS = {
        "default": settings.TASKS["default"],
        "other": {
            "BACKEND": "eventbus.backends.ExactlyOnceBackend",
            "OPTIONS": {
                "SCHEDULES": {
                    "report": {"task": "tests.tasks.tasks.report", "every": 60, "args": ["x"]},
                }
            },
        },
    }
    # The task's queue, "reports", is no queue of "other" (QUEUES: ["default"]).
    [error] = compat.task_backends["other"].check()
    assert error.id == "eventbus.E023" and "cannot run on the backend 'other'" in error.msg


def test_the_check_refuses_schedules_that_are_not_a_dict(settings):
    [error] = check(settings, [{"task": "tests.tasks.tasks.add", "every": 60}])
    assert error.id == "eventbus.E022" and "is list, not a dict" in error.msg
    assert check(settings, {}) == []  # no schedules, and SCHEDULES a known option (no E020)


def test_manage_py_check_runs_the_backends_check(settings):
    """On Django 5.2 too, where the backport registers its check only as an installed app."""
    from django.core.management.base import SystemCheckError

    with_schedules(settings, {"beat": {"task": "tests.tasks.tasks.add", "cron": "0 25 * * *"}})
    with pytest.raises(
        SystemCheckError, match=r"eventbus.E025\) Schedule 'beat': '0 25 \* \* \*' is not a valid"
    ):
        call_command("check")
    with_schedules(settings, {"beat": {"task": "tests.tasks.tasks.add", "cron": "0 23 * * *"}})
    call_command("check")
