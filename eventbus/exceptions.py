"""Errors the job services raise, each for the API to answer with its problem status."""


class JobLimitReached(Exception):
    """The owner has EVENTBUS["MAX_RUNNING_JOBS_PER_USER"] jobs PENDING or RUNNING: no more until
    one ends (the jobs API answers 429 with `Retry-After: retry_after`)."""

    def __init__(self, retry_after: int):
        super().__init__(f"Too many jobs pending or running; retry after {retry_after} s.")
        self.retry_after = retry_after
