"""Periodic schedules: a django.tasks task enqueued at each tick of a cron expression or of an
interval, each tick once, however many schedulers run (`manage.py run_scheduler`).

Declared in settings, in the OPTIONS of an ExactlyOnceBackend:

    TASKS = {"default": {
        "BACKEND": "eventbus.backends.ExactlyOnceBackend",
        "OPTIONS": {"SCHEDULES": {
            "nightly-report": {"task": "reports.tasks.nightly_report", "cron": "0 3 * * *"},
            "heartbeat": {"task": "monitoring.tasks.ping", "every": 60, "missed": "skip"},
        }},
    }}

or in code, in an installed app's `tasks` module (the scheduler imports each) or its
AppConfig.ready(): `schedule("heartbeat", ping, every=timedelta(minutes=1), missed="skip")`.
An entry has `task`, exactly one of `cron` and `every`, and optional `args` (a list), `kwargs`
(a dict) and `missed`. A bad one is refused by the backend's system check (eventbus.E022 to
E028) and by schedule() (ValueError), naming the schedule.

Ticks
-----
- `cron`: a 5-field expression in settings.TIME_ZONE, parsed by Celery's crontab
  (eventbus.djangotasks.cron: its fields, and what it does the days the clocks change).
- `every` (seconds, or a timedelta): the whole multiples of it since the Unix epoch, in UTC:
  `every=3600` ticks at each full hour, whenever the scheduler started.

Each tick once
--------------
A tick is a keyed enqueue: the key `<name>:<tick, UTC ISO 8601>` (`heartbeat:2025-01-01T03:00:00+00:00`)
in the scope join_scope("schedule", "eventbus", <backend alias>), ownerless. Two schedulers at
once, or one started again, enqueue each tick once: the job's UNIQUE (scope, key) in the
database. The task keeps its own queue and priority.

Missed ticks
------------
A scheduler enqueues every tick that comes due while it runs, each at its pass (it looks every
second, and wakes when the next tick is due); one late by more than CATCH_UP (a scheduler
stalled that long) counts as missed. The ticks before a scheduler's first pass are missed too,
unless another scheduler enqueued them. Of a schedule's missed ticks:

- `missed="latest"` (the default): the latest runs, once, at once (unless a newer tick runs);
- `missed="skip"`: none runs; the next tick does.

First tick
----------
A schedule's first tick is the first one after it was first seen: a new schedule never runs a
tick from before it existed. No table records when a schedule was first seen: its jobs do. A
schedule with jobs in its scope (keys `<name>:...`) has run before, and its latest missed tick
may run at once; one with none is new, and its first tick is the first after the pass that
first saw it. Until that tick is enqueued, the sighting is held in the scheduler's memory only:
a scheduler started again before then starts over (a tick that came due while none ran is not
run, since no record shows the schedule existed before it).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules, import_string

from eventbus.bus.loop import LoopWorker
from eventbus.jobtypes import TASKS_BACKEND
from eventbus.models import Job
from idempotency.exceptions import IdempotencyKeyMismatch
from idempotency.scope import join_scope

from . import compat
from .cron import Cron, InvalidCron
from .enqueue import enqueue_as, json_arguments

logger = logging.getLogger(__name__)

LATEST, SKIP = "latest", "skip"
MISSED = (LATEST, SKIP)
FIELDS = ("task", "cron", "every", "args", "kwargs", "missed")
SCOPE_PREFIX = ("schedule", "eventbus")
# A tick's key, `<name>:<UTC ISO 8601 time>`, must stay within a key's 255 characters.
MAX_NAME_LENGTH = 200
# A tick enqueued later than this after its time (a scheduler stalled) counts as missed.
CATCH_UP = timedelta(seconds=60)
# The most ticks of one schedule a pass enqueues (an interval of a fraction of a second).
MAX_TICKS_PER_PASS = 100
LOOK_EVERY = 1.0  # seconds between a scheduler's passes, at most
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The system check's ids, by what is wrong with a schedule.
E_DECLARATION = "eventbus.E022"  # SCHEDULES or an entry is not a dict, unknown fields, a bad name
E_TASK = "eventbus.E023"  # no task, one that does not import, is no Task, or the backend refuses
E_CRON_OR_EVERY = "eventbus.E024"  # not exactly one of cron and every
E_CRON = "eventbus.E025"  # not a valid 5-field cron expression, or one that never ticks
E_EVERY = "eventbus.E026"  # not a number of seconds or a timedelta, or not more than 0
E_MISSED = "eventbus.E027"  # not "latest" or "skip"
E_ARGUMENTS = "eventbus.E028"  # args not a list, kwargs not a dict, or not JSON
HINTS = {
    E_DECLARATION: (
        "SCHEDULES is a dict of schedules by name (1 to 200 printable ASCII characters), each a dict "
        f"of {', '.join(FIELDS)}."
    ),
    E_TASK: "'task' is the dotted path of a function decorated with @task, that this backend accepts.",
    E_CRON_OR_EVERY: "Give either 'cron' (e.g. '0 3 * * *') or 'every' (seconds, or a timedelta).",
    E_CRON: "minute hour day-of-month month day-of-week, e.g. '*/15 * * * *' or '0 3 * * mon-fri'.",
    E_EVERY: "A positive number of seconds, or a timedelta.",
    E_MISSED: f"One of {MISSED}.",
    E_ARGUMENTS: "'args' is a list and 'kwargs' a dict, of JSON values.",
}


class InvalidSchedule(ValueError):
    """A schedule refused: `problems` lists (check id, message), each message naming it."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(message for _, message in problems))


@dataclass(frozen=True)
class Schedule:
    """A task enqueued at each tick of `cron` or `every` (see the module doc): made by
    schedule() and from the settings (from_settings), never by hand. `task` is bound to the
    backend `alias`; `args` and `kwargs` are JSON as the task gets them."""

    name: str
    task: Any  # the Task, bound to the backend `alias`
    alias: str
    cron: Cron | None = None
    every: timedelta | None = None
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    missed: str = LATEST

    @property
    def id(self) -> tuple[str, str]:
        return self.alias, self.name

    @property
    def scope(self) -> str:
        """Where its ticks' keys live: join_scope("schedule", "eventbus", alias)."""
        return join_scope(*SCOPE_PREFIX, self.alias)

    def key(self, tick: datetime) -> str:
        """The key of a tick: `<name>:<tick, UTC ISO 8601>`."""
        return f"{self.name}:{tick.astimezone(UTC).isoformat()}"

    # Ticks -----------------------------------------------------------------------------------

    def latest_tick(self, at: datetime) -> datetime | None:
        """The last tick at or before `at` (aware), in UTC."""
        if self.every is not None:
            return EPOCH + (at - EPOCH) // self.every * self.every
        assert self.cron is not None
        return self.cron.latest_at(at, timezone.get_default_timezone())

    def next_tick(self, after: datetime) -> datetime | None:
        """The first tick strictly after `after` (aware), in UTC; None for none."""
        if self.every is not None:
            return EPOCH + ((after - EPOCH) // self.every + 1) * self.every
        assert self.cron is not None
        return self.cron.next_after(after, timezone.get_default_timezone())

    def ticks_between(
        self, after: datetime, until: datetime, limit: int = MAX_TICKS_PER_PASS
    ) -> list[datetime]:
        """The ticks in (after, until], oldest first: the last `limit` of them."""
        if self.every is not None:
            first, last = (after - EPOCH) // self.every + 1, (until - EPOCH) // self.every
            return [EPOCH + k * self.every for k in range(max(first, last - limit + 1), last + 1)]
        ticks: deque[datetime] = deque(maxlen=limit)
        tick = self.next_tick(after)
        while tick is not None and tick <= until:
            ticks.append(tick)
            tick = self.next_tick(tick)
        return list(ticks)

    # Its jobs --------------------------------------------------------------------------------

    def has_run(self) -> bool:
        """Whether any tick of it was enqueued (a job under one of its keys): it is not new."""
        prefix = f"{self.name}:"
        keys = Job.objects.filter(scope=self.scope, idem_key__startswith=prefix).values_list(
            "idem_key", flat=True
        )
        # startswith is case-insensitive on SQLite: the keys of another schedule's name in
        # another case are no sign of this one.
        return any(key.startswith(prefix) for key in keys.iterator())

    def enqueue(self, tick: datetime) -> Tick:
        """The tick's keyed enqueue (once per tick, whoever asks)."""
        backend = compat.task_backends[self.alias]
        result, created = enqueue_as(
            backend, self.task, self.args, self.kwargs, scope=self.scope, key=self.key(tick)
        )
        return Tick(schedule=self, at=tick, result_id=result.id, created=created)


@dataclass(frozen=True)
class Tick:
    """A tick enqueued by a pass: its task's result id, and whether this pass created its job."""

    schedule: Schedule
    at: datetime
    result_id: str
    created: bool


# Declaring -----------------------------------------------------------------------------------


def schedule(
    name: str,
    task,
    *,
    cron: str | None = None,
    every: float | timedelta | None = None,
    args: Sequence = (),
    kwargs: dict | None = None,
    missed: str = "latest",
) -> Schedule:
    """Enqueue `task` at each tick of `cron` or `every`, each tick once (`manage.py run_scheduler`).

    Call it where the scheduler imports it: an installed app's `tasks` module, or its
    AppConfig.ready(). The schedule belongs to the task's backend (an ExactlyOnceBackend), beside
    those of its OPTIONS["SCHEDULES"]; the same declaration made again is a no-op.

    Parameters
    ----------
    name : str
        The schedule's name, unique per backend: 1 to 200 printable ASCII characters. Each tick's
        key is `<name>:<tick, UTC ISO 8601>`.
    task : Task
        The task (a function decorated with @task); it is enqueued with its own queue and priority.
    cron : str, optional
        A 5-field cron expression (minute hour day-of-month month day-of-week) in
        settings.TIME_ZONE, e.g. `"0 3 * * *"`.
    every : float or timedelta, optional
        An interval (seconds, or a timedelta) more than 0: the ticks are its whole multiples
        since the Unix epoch. Exactly one of `cron` and `every` is given.
    args : sequence, optional
        The task's positional arguments (JSON).
    kwargs : dict, optional
        The task's keyword arguments (JSON).
    missed : {"latest", "skip"}, optional
        Of the ticks missed while no scheduler ran: "latest" (the default) runs the latest, once,
        at once; "skip" runs none, and the next tick runs.

    Returns
    -------
    Schedule
        The schedule declared.

    Raises
    ------
    ValueError
        For a bad declaration (the message names the schedule and what is wrong), or a name
        already declared differently for the backend (in code or in its settings).

    Examples
    --------
    >>> schedule("nightly-report", nightly_report, cron="0 3 * * *")  # doctest: +SKIP
    >>> schedule("heartbeat", ping, every=timedelta(minutes=1), missed="skip")  # doctest: +SKIP
    """
    problems = _name_problems(name)
    if not isinstance(task, compat.Task):
        problems.append(
            _problem(name, E_TASK, f"the task is {task!r}, not a django.tasks task (decorate it with @task)")
        )
        raise InvalidSchedule(problems)
    alias = task.backend
    backend = compat.task_backends[alias]
    if not is_exactly_once(backend):
        problems.append(
            _problem(
                name, E_TASK, f"its task's backend {alias!r} is no ExactlyOnceBackend: only it runs schedules"
            )
        )
        raise InvalidSchedule(problems)
    declared = _build(
        name, task, alias, cron=cron, every=every, args=args, kwargs=kwargs, missed=missed, problems=problems
    )
    if name in (backend.options.get("SCHEDULES") or {}):
        raise ValueError(f"Schedule {name!r}: already declared in TASKS[{alias!r}]['OPTIONS']['SCHEDULES']")
    before = _DECLARED.setdefault(declared.id, declared)
    if before != declared:
        raise ValueError(
            f"Schedule {name!r}: already declared for the backend {alias!r}, otherwise: {before}"
        )
    return declared


# The schedules declared in code, by (alias, name).
_DECLARED: dict[tuple[str, str], Schedule] = {}


def from_settings(alias: str, name, spec) -> Schedule:
    """The schedule of an entry of TASKS[alias]["OPTIONS"]["SCHEDULES"].

    Raises
    ------
    InvalidSchedule
        With every problem of the entry.
    """
    problems = _name_problems(name)
    if not isinstance(spec, dict):
        problems.append(_problem(name, E_DECLARATION, f"its entry is {type(spec).__name__}, not a dict"))
        raise InvalidSchedule(problems)
    unknown = sorted(str(field) for field in set(spec) - set(FIELDS))
    if unknown:
        problems.append(
            _problem(name, E_DECLARATION, f"its entry has fields a schedule does not know: {unknown}")
        )
    task = _task_at(spec.get("task"), alias, name, problems)
    return _build(
        name,
        task,
        alias,
        cron=spec.get("cron"),
        every=spec.get("every"),
        args=spec.get("args", ()),
        kwargs=spec.get("kwargs"),
        missed=spec.get("missed", LATEST),
        problems=problems,
    )


def declared_schedules() -> list[Schedule]:
    """Every schedule: those of each ExactlyOnceBackend's OPTIONS["SCHEDULES"], then those
    declared in code (schedule()).

    Raises
    ------
    ImproperlyConfigured
        For a bad entry in the settings (the system check names it first).
    """
    found = []
    for alias in exactly_once_aliases():
        entries = compat.task_backends[alias].options.get("SCHEDULES") or {}
        if not isinstance(entries, dict):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['SCHEDULES'] is not a dict of schedules by name"
            )
        for name, spec in entries.items():
            try:
                found.append(from_settings(alias, name, spec))
            except InvalidSchedule as exc:
                raise ImproperlyConfigured(str(exc)) from None
    aliases = exactly_once_aliases()
    return found + [declared for (alias, _), declared in _DECLARED.items() if alias in aliases]


def exactly_once_aliases() -> list[str]:
    """The TASKS aliases whose backend is ExactlyOnceBackend (or a subclass); a backend that does
    not import is Django's check's to name."""
    aliases = []
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        try:
            backend = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue
        if _is_exactly_once_class(backend):
            aliases.append(alias)
    return aliases


def is_exactly_once(backend) -> bool:
    """Whether a backend (an instance) is an ExactlyOnceBackend."""
    return _is_exactly_once_class(type(backend))


def _is_exactly_once_class(cls) -> bool:
    # By name: eventbus.backends imports this module.
    return any(f"{c.__module__}.{c.__qualname__}" == TASKS_BACKEND for c in getattr(cls, "__mro__", ()))


def check_backend(backend) -> list[Error]:
    """The system check of a backend's OPTIONS["SCHEDULES"] (ExactlyOnceBackend.check)."""
    entries = backend.options.get("SCHEDULES")
    if entries is None:
        return []
    where = f"TASKS[{backend.alias!r}]['OPTIONS']['SCHEDULES']"
    if not isinstance(entries, dict):
        return [
            Error(
                f"{where} is {type(entries).__name__}, not a dict of schedules by name.",
                hint=HINTS[E_DECLARATION],
                id=E_DECLARATION,
            )
        ]
    errors: list[Error] = []
    for name, spec in entries.items():
        try:
            from_settings(backend.alias, name, spec)
        except InvalidSchedule as exc:
            errors.extend(
                Error(f"{message} ({where})", hint=HINTS[id_], id=id_) for id_, message in exc.problems
            )
    return errors


def _problem(name, check_id: str, what: str) -> tuple[str, str]:
    return check_id, f"Schedule {name!r}: {what}"


def _name_problems(name) -> list[tuple[str, str]]:
    if not isinstance(name, str) or not name:
        return [_problem(name, E_DECLARATION, "a schedule's name is a non-empty string")]
    if len(name) > MAX_NAME_LENGTH or not all(" " <= ch <= "~" for ch in name):
        return [
            _problem(
                name,
                E_DECLARATION,
                f"a name is 1 to {MAX_NAME_LENGTH} printable ASCII characters (its ticks' keys)",
            )
        ]
    return []


def _task_at(path, alias: str, name, problems: list) -> Any:
    """The Task a settings entry names, bound to its backend; None (a problem noted) when not."""
    if path is None or path == "":
        problems.append(_problem(name, E_TASK, "it has no 'task' (the dotted path of a django.tasks task)"))
        return None
    if not isinstance(path, str):
        problems.append(
            _problem(name, E_TASK, f"its 'task' is {path!r}, not the dotted path of a django.tasks task")
        )
        return None
    try:
        task = import_string(path)
    except Exception as exc:  # whatever importing its module raises
        problems.append(_problem(name, E_TASK, f"its task {path!r} cannot be imported: {exc}"))
        return None
    if not isinstance(task, compat.Task):
        problems.append(
            _problem(name, E_TASK, f"{path!r} is not a django.tasks task (decorate its function with @task)")
        )
        return None
    return task


def _build(name, task, alias: str, *, cron, every, args, kwargs, missed, problems: list) -> Schedule:
    """The schedule, once every field is checked; InvalidSchedule with all of its problems."""
    if task is not None and task.backend != alias:
        try:
            task = task.using(backend=alias)  # a settings entry runs on the backend declaring it
        except Exception as exc:
            problems.append(_problem(name, E_TASK, f"its task cannot run on the backend {alias!r}: {exc}"))
            task = None
    kwargs = {} if kwargs is None else kwargs
    parsed_cron, interval = None, None
    if (cron is None) == (every is None):
        problems.append(_problem(name, E_CRON_OR_EVERY, "give exactly one of 'cron' and 'every'"))
    elif cron is not None:
        try:
            parsed_cron = Cron.parse(cron)
        except InvalidCron as exc:
            problems.append(_problem(name, E_CRON, str(exc)))
    else:
        interval = _interval(every)
        if interval is None:
            problems.append(
                _problem(
                    name, E_EVERY, f"'every' is {every!r}: a number of seconds, or a timedelta, more than 0"
                )
            )
    if missed not in MISSED:
        problems.append(_problem(name, E_MISSED, f"'missed' is {missed!r}, not one of {MISSED}"))
    arguments = None
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
        problems.append(
            _problem(
                name,
                E_ARGUMENTS,
                f"'args' is a list and 'kwargs' a dict, not {type(args).__name__} and {type(kwargs).__name__}",
            )
        )
    else:
        try:
            arguments = json_arguments(list(args), dict(kwargs))
        except TypeError as exc:
            problems.append(_problem(name, E_ARGUMENTS, str(exc)))
    if problems:
        raise InvalidSchedule(problems)
    assert arguments is not None
    return Schedule(
        name=name,
        task=task,
        alias=alias,
        cron=parsed_cron,
        every=interval,
        args=arguments[0],
        kwargs=arguments[1],
        missed=missed,
    )


def _interval(every) -> timedelta | None:
    if isinstance(every, timedelta):
        interval = every
    elif isinstance(every, int | float) and not isinstance(every, bool) and math.isfinite(every):
        try:
            interval = timedelta(seconds=every)
        except OverflowError:
            return None
    else:
        return None
    return interval if interval > timedelta(0) else None


# Enqueueing the ticks --------------------------------------------------------------------------


@dataclass(frozen=True)
class Watch:
    """What a scheduler knows of a schedule between its passes: up to when it enqueued its
    ticks, and its next tick."""

    handled_until: datetime
    upcoming: datetime | None


def run_pass(schedules, *, now: datetime | None = None, watches: dict | None = None) -> list[Tick]:
    """One pass of a scheduler: each schedule's ticks due at `now`, enqueued (see the module
    doc's Missed ticks and First tick).

    Parameters
    ----------
    schedules : iterable of Schedule
    now : datetime, optional
        The time of the pass (aware); by default now.
    watches : dict, optional
        The scheduler's memory, kept from one pass to the next (Watch by schedule id); a new,
        empty dict is a scheduler's first pass.

    Returns
    -------
    list of Tick
        The ticks enqueued (each `created` unless another scheduler, or an earlier pass, did first).
    """
    now = now or datetime.now(UTC)
    watches = {} if watches is None else watches
    enqueued = []
    for declared in schedules:
        watch = watches.get(declared.id)
        due: list[datetime] = []
        if watch is None:
            # First seen by this scheduler: every tick so far is missed. The latest runs, if the
            # schedule has run before (else it is new: no tick from before it was first seen).
            latest = declared.latest_tick(now) if declared.missed == LATEST else None
            if latest is not None and declared.has_run():
                due = [latest]
        elif watch.upcoming is None or now < watch.upcoming:
            continue  # no tick came due since its last pass
        else:
            due = declared.ticks_between(max(watch.handled_until, now - CATCH_UP), now)
            if not due and declared.missed == LATEST:  # the ticks since its last pass are all late
                due = [tick for tick in [declared.latest_tick(now)] if tick is not None]
        for tick in due:
            try:
                enqueued.append(declared.enqueue(tick))
            except (compat.InvalidTask, TypeError, ValueError, IdempotencyKeyMismatch) as exc:
                # Refused, and it would be again: the other ticks and schedules go on.
                logger.error("Schedule %r: its tick %s was refused: %r", declared.name, tick.isoformat(), exc)
                continue
            if enqueued[-1].created:
                logger.info(
                    "Schedule %r: tick %s enqueued (task %s)",
                    declared.name,
                    tick.isoformat(),
                    enqueued[-1].result_id,
                )
        watches[declared.id] = Watch(handled_until=now, upcoming=declared.next_tick(now))
    return enqueued


class Scheduler(LoopWorker):
    """`manage.py run_scheduler`: a pass every second at most (or when the next tick is due)
    until stopped, with eventbus.bus.loop's loop (a failed pass is tried again, its ticks with
    it). `schedules`: these instead of the declared ones (tests)."""

    name = "run_scheduler"
    one_pass_burst = True  # --burst: one pass, then exit
    pause = LOOK_EVERY

    def __init__(self, *, burst: bool = False, schedules: list[Schedule] | None = None):
        super().__init__(burst=burst)
        self.given = schedules
        self.schedules: list[Schedule] = []
        self.watches: dict[tuple[str, str], Watch] = {}

    def setup(self) -> None:
        if self.given is None:
            autodiscover_modules("tasks")  # where schedule() is called
            self.schedules = declared_schedules()
        else:
            self.schedules = list(self.given)
        if not self.burst:
            names = ", ".join(f"{s.alias}:{s.name}" for s in self.schedules) or "none"
            logger.info(
                "Scheduling %d schedule(s) (%s), looking every %gs", len(self.schedules), names, LOOK_EVERY
            )

    def work_once(self) -> int:
        ticks = run_pass(self.schedules, watches=self.watches)
        self.pause = self._until_next(datetime.now(UTC))
        return sum(tick.created for tick in ticks)

    def _until_next(self, now: datetime) -> float:
        """Seconds to wait: until just after the next tick of any schedule, at most LOOK_EVERY."""
        upcoming = [
            watch.upcoming
            for watch in (self.watches.get(s.id) for s in self.schedules)
            if watch is not None and watch.upcoming is not None
        ]
        if not upcoming:
            return LOOK_EVERY
        return min(LOOK_EVERY, max(0.01, (min(upcoming) - now).total_seconds() + 0.01))
