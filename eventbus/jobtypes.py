"""Job types: the public API a project declares its own jobs with.

    from eventbus.jobtypes import JobType, Stage, register

    @register
    class Transcode(JobType):
        name = "transcode"                      # `domain` on the wire: its streams, the jobs API's value
        stages = (
            Stage("fetch", "Fetching the file"),
            Stage("encode", "Encoding"),
        )

        def clean_payload(self, payload):       # refuse a bad payload: POST /api/jobs/ answers 400
            if "url" not in payload:
                raise InvalidPayload({"url": "required"})
            return payload

        def fetch(self, ctx):                   # one method per stage, named after it
            ctx.report(done=1, of=2, text="half way")   # a progress event, live
            return {"path": download(ctx.payload["url"], idempotency_key=ctx.key)}

        def encode(self, ctx):
            return {"out": encode(ctx.results["fetch"]["path"])}

        def outcome(self, results):             # data of the job's final event
            return {"out": results["encode"]["out"]}

A stage's work is plain Python. Its return value (JSON, or what Django's DjangoJSONEncoder takes:
a Decimal is recorded as its string, a datetime as ISO 8601...) is recorded durably when
the stage finishes, with the events it reported; a re-run of the job (a worker killed, a task
redelivered) skips finished stages, republishes their recorded events (the bus drops the
copies) and runs again only the stage that was in flight. `ctx.key` (job id + stage) is stable
across runs: pass it to outside APIs that take an idempotency key, so even the interrupted
stage's outside effect happens once.

Seqs come from the declared stages: each stage owns a range of `Stage.width` seqs (10 by
default) in declared order from 10, unless it names its first seq; the final event follows
the last range (51 for up to four stages, the seed's numbering). A stage that reports nothing
gets one event when it finishes. Progress goes from 0 to 100 over the stages (100 on the final
event); `ctx.report(done=, of=)` moves it within a stage, `progress=` sets it outright.

Register a type with `@register`, in a `jobs` module of an installed app (imported at startup),
or list its dotted path in EVENTBUS["JOB_TYPES"].

This module owns the registry, and with it the domains: a domain (the name of a job's streams
and keys) is a registered type's name or a name in EVENTBUS["DOMAINS"], which also overrides a
type's `shards`. `domains()` and `shard_count()` answer for the whole bus (eventbus.bus.keys places
every key by them); what they build is dropped when EVENTBUS changes or a type registers.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from eventbus.conf import eventbus_settings

FIRST_SEQ = 10
DEFAULT_WIDTH = 10
# The seed's final seq: the done range is 50-59 and its one event is 51, for up to four stages.
MIN_FINAL_SEQ = 51
FINAL_STAGE = "done"
# A signal's name (Stage.signals, ctx.wait_for): it is a path segment of the jobs API.
SIGNAL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TASKS_BACKEND = "eventbus.backends.ExactlyOnceBackend"


class InvalidPayload(ValueError):
    """A job's payload refused by its type's `clean_payload`: the jobs API answers 400 with
    `errors`.

    Parameters
    ----------
    errors : str or dict
        A message, or a dict of field -> message.
    """

    def __init__(self, errors):
        super().__init__(errors)
        self.errors = errors


class JobFailed(Exception):
    """Raised by a stage to end the job FAILED, with `reason` as the message of its error (the
    job's detail and final event: `{"stage", "type": "JobFailed", "message": reason}`) and `data`
    in its final event. Any other exception fails the job too (its type and message), except
    Redis or database errors, which are retried.

    Parameters
    ----------
    reason : str
        The message of the job's error.
    **data
        The data of its final event.
    """

    def __init__(self, reason: str, **data):
        super().__init__(reason)
        self.reason, self.data = reason, data


class StageTimeout(TimeoutError):
    """The stage ran past its `Stage.timeout`: raised where the stage reports (`ctx.report()`)
    or asks (`ctx.cancelled`, `ctx.check()`), and when it returns late. A failed attempt,
    retried while the stage has retries left."""


class JobCancelled(Exception):
    """The job was cancelled (eventbus.cancel_job): raised where the running stage reports or
    calls `ctx.check()`. The job ends CANCELLED; a stage may catch it to clean up first."""


class UnknownJobType(LookupError, ValueError):
    """No registered job type of that name (job_type()), or a name with no streams at all:
    neither a registered job type's nor one in EVENTBUS["DOMAINS"] (shard_count(), whose
    message says "Unknown domain": the bus's word for a name on the wire, see JobType.name).
    A LookupError, and a ValueError as the bus's former UnknownDomain was."""


# The bus's former name for the error of a name with no streams, one class with UnknownJobType
# now: kept so that `from eventbus.jobtypes import UnknownDomain` (CHANGELOG, 0.1's move from
# eventbus.bus.keys) keeps working. New code says UnknownJobType.
UnknownDomain = UnknownJobType


# Never retried, whatever a stage's retry_on says: the stage itself chose to end the job.
NEVER_RETRIED: tuple[type[BaseException], ...] = (JobFailed, JobCancelled)


@dataclass(frozen=True)
class Stage:
    """A stage of a job type: a method of the type, named after the stage, runs its work.

    Parameters
    ----------
    name : str
        The stage's name: an identifier, the name of its method.
    label : str
        Its label (by default its name capitalised, "_" read as a space).
    first_seq : int, optional
        The stage's first seq; None: right after the previous stage's range.
    width : int
        How many events the stage may report (its seq range), at least 1.
    retries : int
        How many more times a failed attempt runs again (0).
    retry_on : exception class or tuple of them
        The failures retried (a StageTimeout always is); by default any Exception.
    backoff : float
        Seconds before the first retry: a retry waits backoff * 2**(attempt - 1) seconds, +-20 %.
    timeout : float, optional
        Seconds an attempt may take (None: no limit); past it the attempt fails with
        StageTimeout.
    atomic : bool
        Run the stage's code in one database transaction with the write that records it
        finished: its ORM writes commit exactly once (none after a crash before the commit; the
        stage never runs again after it). Hold no long outside call in it: the transaction
        stays open while the stage runs. Its progress events are published once it commits.
        False by default.
    signals : tuple of str
        The signals the stage may wait for (ctx.wait_for): the jobs API, the admin and the page
        offer these, and signal_job refuses others.

    Raises
    ------
    django.core.exceptions.ImproperlyConfigured
        For a value out of these bounds.
    """

    name: str
    label: str = ""
    # The stage's first seq; None: right after the previous stage's range.
    first_seq: int | None = None
    # How many events the stage may report (its seq range).
    width: int = DEFAULT_WIDTH
    # A failed attempt whose exception is one of `retry_on` (a StageTimeout always is) runs
    # again, up to `retries` more times, after backoff * 2**(attempt - 1) seconds, +-20 %.
    retries: int = 0
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    backoff: float = 1.0
    # Seconds an attempt may take (None: no limit); past it the attempt fails with StageTimeout.
    timeout: float | None = None
    # The stage's code and the write that records it finished, in one transaction (exactly-once
    # ORM writes; docs/howto/durable-stages.md).
    atomic: bool = False
    # The signals its code may wait for (ctx.wait_for).
    signals: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.name.isidentifier() or self.name == FINAL_STAGE:
            raise ImproperlyConfigured(
                f"Stage name {self.name!r} must be an identifier other than {FINAL_STAGE!r}."
            )
        if self.width < 1:
            raise ImproperlyConfigured(f"Stage {self.name!r}: width must be at least 1.")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ImproperlyConfigured(f"Stage {self.name!r}: retries must be an int >= 0.")
        retry_on = self.retry_on if isinstance(self.retry_on, tuple) else (self.retry_on,)
        if not all(isinstance(e, type) and issubclass(e, BaseException) for e in retry_on):
            raise ImproperlyConfigured(f"Stage {self.name!r}: retry_on must be exception classes.")
        object.__setattr__(self, "retry_on", retry_on)
        if not isinstance(self.backoff, (int, float)) or self.backoff < 0:
            raise ImproperlyConfigured(f"Stage {self.name!r}: backoff must be a number of seconds >= 0.")
        if self.timeout is not None and (not isinstance(self.timeout, (int, float)) or self.timeout <= 0):
            raise ImproperlyConfigured(f"Stage {self.name!r}: timeout must be a number of seconds > 0.")
        if not isinstance(self.atomic, bool):
            raise ImproperlyConfigured(f"Stage {self.name!r}: atomic must be True or False.")
        signals = (self.signals,) if isinstance(self.signals, str) else tuple(self.signals)
        if not all(isinstance(n, str) and SIGNAL_NAME.fullmatch(n) for n in signals):
            raise ImproperlyConfigured(
                f"Stage {self.name!r}: signals must be names of 1 to 64 letters, digits, '_' or '-'."
            )
        object.__setattr__(self, "signals", signals)

    def retryable(self, exc: BaseException, attempt: int) -> bool:
        """Whether a failure of attempt `attempt` (1, 2...) runs the stage again.

        Parameters
        ----------
        exc : BaseException
            The attempt's failure.
        attempt : int
            The attempt's number, from 1.

        Returns
        -------
        bool
        """
        if attempt > self.retries or isinstance(exc, NEVER_RETRIED):
            return False
        return isinstance(exc, (StageTimeout, *self.retry_on))

    def retry_delay(self, attempt: int) -> float:
        """Seconds before the attempt after `attempt`: exponential, with +-20 % jitter so that
        the jobs a shared outage failed together do not come back together.

        Parameters
        ----------
        attempt : int
            The failed attempt's number, from 1.

        Returns
        -------
        float
        """
        return self.backoff * 2 ** (attempt - 1) * random.uniform(0.8, 1.2)


@dataclass(frozen=True)
class PlannedStage:
    """A stage with its place in the job: index, seq range and progress span."""

    stage: Stage
    index: int
    first_seq: int
    progress_from: float
    progress_to: float

    @property
    def name(self) -> str:
        return self.stage.name

    @property
    def label(self) -> str:
        return self.stage.label or self.stage.name.replace("_", " ").capitalize()

    def seq(self, sub_seq: int) -> int:
        if not 0 <= sub_seq < self.stage.width:
            raise ValueError(
                f"Stage {self.name!r} reported more than {self.stage.width} events; "
                f"declare Stage({self.name!r}, width=...) to allow more."
            )
        return self.first_seq + sub_seq

    def progress(self, done: float, of: float) -> int:
        fraction = min(max(done / of, 0.0), 1.0) if of else 1.0
        return int(self.progress_from + (self.progress_to - self.progress_from) * fraction)


class JobType:
    """Subclass, set `name` and `stages`, and write one method per stage (see the module doc)."""

    name: ClassVar[str] = ""
    stages: ClassVar[tuple[Stage, ...]] = ()
    # Shards of this type's stream (EVENTBUS["DOMAINS"] may override it).
    shards: ClassVar[int] = 4
    final_label: ClassVar[str] = "Done"
    # For the page's form: what to say of the type, and a payload it accepts.
    description: ClassVar[str] = ""
    example_payload: ClassVar[dict] = {}
    # Whether POST /api/jobs/ (and the page's form) may start one; False: only code does
    # (start_job), e.g. the `task` type of django.tasks tasks, whose payload names code to run.
    startable_by_api: ClassVar[bool] = True

    def clean_payload(self, payload: dict) -> dict:
        """The payload to accept. Default: any JSON object.

        Parameters
        ----------
        payload : dict
            The payload as given.

        Returns
        -------
        dict
            The payload to accept.

        Raises
        ------
        InvalidPayload
            For a payload to refuse (the jobs API answers 400).
        """
        return payload

    def outcome(self, results: dict[str, Any]) -> dict:
        """Data for the final event of a completed job, from each stage's result.

        Parameters
        ----------
        results : dict
            Each stage's result, by the stage's name.

        Returns
        -------
        dict
        """
        return {}

    # -- what the toolkit derives from the declaration ------------------------------------

    @classmethod
    def plan(cls) -> list[PlannedStage]:
        return _plan(cls)

    @classmethod
    def signal_names(cls) -> tuple[str, ...]:
        """Every signal its stages declare (Stage.signals), in order."""
        return tuple(dict.fromkeys(name for stage in cls.stages for name in stage.signals))

    @classmethod
    def final_seq(cls) -> int:
        planned = cls.plan()
        end = max((p.first_seq + p.stage.width for p in planned), default=FIRST_SEQ)
        # The final event opens the range after the last stage's, as done's 51 does.
        return max(MIN_FINAL_SEQ, -(-end // 10) * 10 + 1)

    def work_of(self, stage: Stage) -> Callable:
        """The method that runs a stage's work: the one named after it.

        Parameters
        ----------
        stage : Stage
            One of the type's stages.

        Returns
        -------
        callable
        """
        return getattr(self, stage.name)


def _plan(job_type: type[JobType]) -> list[PlannedStage]:
    planned, next_seq, n = [], FIRST_SEQ, len(job_type.stages)
    for index, stage in enumerate(job_type.stages):
        first = next_seq if stage.first_seq is None else stage.first_seq
        # Progress spans: stage i of n ends at 100 * (i + 1) / (n + 1); the final event is 100.
        planned.append(PlannedStage(stage, index, first, 100 * index / (n + 1), 100 * (index + 1) / (n + 1)))
        next_seq = first + stage.width
    return planned


def validate(job_type: type[JobType]) -> None:
    """Refuse a declaration the toolkit could not run: checked when it is registered."""
    where = f"Job type {job_type.__qualname__}"
    if not isinstance(job_type.name, str) or not job_type.name.isidentifier():
        raise ImproperlyConfigured(
            f"{where}: name must be an identifier (it names Redis keys), not {job_type.name!r}."
        )
    if not job_type.stages:
        raise ImproperlyConfigured(f"{where}: declare at least one Stage.")
    names = [stage.name for stage in job_type.stages]
    if len(set(names)) != len(names):
        raise ImproperlyConfigured(f"{where}: stage names repeat: {names}.")
    last_end = 0
    for planned in _plan(job_type):
        if planned.first_seq < max(last_end, 1):
            raise ImproperlyConfigured(
                f"{where}: stage {planned.name!r} starts at seq {planned.first_seq}, "
                f"inside the range before it (seqs must rise stage by stage)."
            )
        last_end = planned.first_seq + planned.stage.width
        if not callable(getattr(job_type, planned.name, None)):
            raise ImproperlyConfigured(
                f"{where}: stage {planned.name!r} needs a method {planned.name}(self, ctx)."
            )


_DECORATED: dict[str, type[JobType]] = {}  # by @register
_registry: dict[str, type[JobType]] | None = None  # with EVENTBUS["JOB_TYPES"], built on first use


def _add(types: dict[str, type[JobType]], job_type: type[JobType]) -> None:
    validate(job_type)
    existing = types.get(job_type.name)
    if existing is not None and existing is not job_type:
        raise ImproperlyConfigured(
            f"Two job types are named {job_type.name!r}: {existing.__module__}.{existing.__qualname__} "
            f"and {job_type.__module__}.{job_type.__qualname__}."
        )
    types[job_type.name] = job_type


def register(job_type: type[JobType]) -> type[JobType]:
    """Class decorator: make `job_type` runnable and accepted by the jobs API.

    Parameters
    ----------
    job_type : JobType subclass
        The type to register.

    Returns
    -------
    JobType subclass
        `job_type` itself.
    """
    # Checked against the settings' types when the registry is built: building it here would
    # import EVENTBUS["JOB_TYPES"], which may name the module being imported right now.
    _add(_DECORATED, job_type)
    _forget()
    return job_type


def registry() -> dict[str, type[JobType]]:
    """Every registered job type by name: those of EVENTBUS["JOB_TYPES"] and of @register."""
    global _registry
    if _registry is None:
        types = dict(_DECORATED)
        for path in (*eventbus_settings.JOB_TYPES, *_task_job_type()):
            _add(types, import_string(path))
        _registry = types
    return _registry


def _task_job_type() -> list[str]:
    """The job type django.tasks tasks run as, when a TASKS backend is
    eventbus.backends.ExactlyOnceBackend (or a subclass of it)."""
    from django.conf import settings

    for params in (getattr(settings, "TASKS", None) or {}).values():
        try:
            backend = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # Django's own check names a backend that does not import
        # By name: eventbus.backends imports this module.
        if any(
            f"{cls.__module__}.{cls.__qualname__}" == TASKS_BACKEND for cls in getattr(backend, "__mro__", ())
        ):
            return ["eventbus.djangotasks.taskjob.TaskJob"]
    return []


def job_type(name: str) -> type[JobType]:
    try:
        return registry()[name]
    except (KeyError, TypeError):
        raise UnknownJobType(f"No job type {name!r}; registered: {sorted(registry())}") from None


def domains() -> list[str]:
    """Every domain: the registered job types', then those only in EVENTBUS["DOMAINS"]."""
    names = list(registry())
    return names + [name for name in eventbus_settings.DOMAINS if name not in names]


# Shard counts by domain, as the settings and the registry last gave them: every event
# published or routed asks (eventbus.bus.keys.JobKeys), and walking the settings each time was a
# tenth of a publish. Forgotten with the registry.
_shard_counts: dict[str, int] = {}


def shard_count(domain: str) -> int:
    """How many shard streams the domain has; UnknownJobType for a name that is no domain."""
    try:
        return _shard_counts[domain]
    except (KeyError, TypeError):  # TypeError: not even a possible name (unhashable)
        pass
    try:
        configured = eventbus_settings.DOMAINS.get(domain)
        count = int(configured if configured is not None else registry()[domain].shards)
    except (KeyError, TypeError):
        raise UnknownJobType(f"Unknown domain {domain!r}; configured: {sorted(domains())}") from None
    _shard_counts[domain] = count
    return count


def _forget() -> None:
    """Drop what was built from the registrations and the settings: the registry, shard counts."""
    global _registry
    _registry = None
    _shard_counts.clear()


def _on_setting_changed(*, setting, **kwargs):
    if setting in ("EVENTBUS", "TASKS"):
        _forget()


setting_changed.connect(_on_setting_changed, weak=False)
