"""Errors of the job services (eventbus.services), each with the HTTP status the jobs API
answers it with (a problem+json)."""

from __future__ import annotations


class JobServiceError(Exception):
    status = 400
    title = "The job cannot do this"
    problem_type = "about:blank"  # the problem+json `type` of the answer

    def problem_members(self) -> dict:
        """The answer's problem+json extension members, besides type, title, status and detail."""
        return {}


class JobEnded(JobServiceError):
    """cancel_job() or signal_job() of a job that has ended (COMPLETED, FAILED, TIMED_OUT or
    CANCELLED).

    Parameters
    ----------
    job : Job
        The job.
    consequence : str
        What its end means for the call (the detail's end).
    """

    status = 409
    title = "The job has ended"
    problem_type = "urn:problem:job-ended"

    def __init__(self, job, consequence: str = "there is nothing to cancel"):
        super().__init__(f"Job {job.id} is {job.state}: it has ended, {consequence}.")
        self.job = job


class JobNotRetryable(JobServiceError):
    """retry_job() of a job that is not FAILED, TIMED_OUT or CANCELLED.

    Parameters
    ----------
    job : Job
        The job.
    """

    status = 409
    title = "The job cannot be retried"
    problem_type = "urn:problem:job-not-retryable"

    def __init__(self, job):
        super().__init__(
            f"Job {job.id} is {job.state}: only a FAILED, TIMED_OUT or CANCELLED job can be retried."
        )
        self.job = job


class JobAlreadyRetried(JobServiceError):
    """retry_job() with a new key of a job retried before: a job has at most one retry.

    Parameters
    ----------
    job : Job
        The job.
    retried_by
        The id of its retry's job.
    """

    status = 409
    title = "The job was retried already"
    problem_type = "urn:problem:job-retried"

    def __init__(self, job, retried_by):
        super().__init__(f"Job {job.id} was retried already, as job {retried_by}: a job is retried once.")
        self.job = job
        self.retried_by = retried_by

    def problem_members(self) -> dict:
        """The problem's extension members: the retry's job id."""
        return {"retried_by": str(self.retried_by)}


class JobLimitReached(JobServiceError):
    """The owner has as many running jobs as they may (EVENTBUS["MAX_RUNNING_JOBS_PER_USER"]).

    Parameters
    ----------
    retry_after : int
        The seconds the client waits before it retries (its Retry-After).
    message : str
        The detail; by default one that names retry_after.
    """

    status = 429
    title = "Too many running jobs"
    problem_type = "urn:problem:job-limit-reached"

    def __init__(self, retry_after: int, message: str = ""):
        super().__init__(message or f"Too many running jobs; retry after {retry_after} s.")
        self.retry_after = retry_after


class JobCreationLimitReached(JobLimitReached):
    """The owner has started as many jobs as they may in the period
    (EVENTBUS["MAX_JOBS_CREATED_PER_USER"] per EVENTBUS["JOBS_CREATED_PERIOD"] seconds)."""

    title = "Too many jobs started"
    problem_type = "urn:problem:job-creation-limit-reached"


class UnknownSignal(JobServiceError):
    """signal_job() with a name no stage of the job's type declares (Stage.signals).

    Parameters
    ----------
    job : Job
        The job.
    name : str
        The signal's name.
    known : tuple of str
        The names its type declares.
    """

    status = 400
    title = "No such signal"
    problem_type = "urn:problem:unknown-signal"

    def __init__(self, job, name: str, known: tuple[str, ...]):
        super().__init__(f"A {job.domain} job takes no signal {name!r}; it takes {list(known)}.")
        self.job, self.name, self.known = job, name, known

    def problem_members(self) -> dict:
        """The problem's extension members: the signals the job takes."""
        return {"signals": list(self.known)}


class SignalAlreadySent(JobServiceError):
    """signal_job() with a new key for a signal the job has already been sent: one signal of
    each name per job (its first sender's; the same key gives that one back).

    Parameters
    ----------
    job : Job
        The job.
    name : str
        The signal's name.
    """

    status = 409
    title = "The signal was sent already"
    problem_type = "urn:problem:signal-sent"

    def __init__(self, job, name: str):
        super().__init__(f"Job {job.id} has been sent the signal {name!r} already, under another key.")
        self.job, self.name = job, name

    def problem_members(self) -> dict:
        """The problem's extension members: the signal's name."""
        return {"signal": self.name}
