"""Errors raised by the idempotency layer, each with the HTTP status it maps to."""


class IdempotencyError(Exception):
    status = 400
    title = "Idempotency error"
    type = "about:blank"
    # What a client should do about it: shown on the problem type's documentation page.
    remedy = ""


class IdempotencyKeyMissing(IdempotencyError):
    """A view that requires a key was called without one."""

    status = 400
    title = "Idempotency-Key missing"
    type = "urn:problem:idempotency-key-missing"
    remedy = (
        "Send the header with a new unique key (a UUID, say) per operation, and the same key on every "
        "retry of that operation."
    )


class IdempotencyKeyInvalid(IdempotencyError):
    """The key is empty, too long, or not printable ASCII."""

    status = 400
    title = "Invalid Idempotency-Key"
    type = "urn:problem:idempotency-key-invalid"
    remedy = "Use 1 to 255 printable ASCII characters, bare or as an RFC 8941 quoted string."


class IdempotencyKeyMismatch(IdempotencyError):
    """The key was used before for another request (another body, query string, route or call)."""

    status = 422
    title = "Idempotency-Key reused with another request"
    type = "urn:problem:idempotency-key-mismatch"
    remedy = "Retry with exactly the request first sent under this key, or use a new key for a new request."


class IdempotencyInProgress(IdempotencyError):
    """Another request holds the key's lease and is still running.

    Parameters
    ----------
    message : str
        The detail; by default "Retry after <retry_after> s.".
    retry_after : int
        The seconds the client waits before it retries (its Retry-After).
    """

    status = 409
    title = "A request with this Idempotency-Key is in progress"
    type = "urn:problem:idempotency-in-progress"
    remedy = (
        "Wait for the seconds in Retry-After, then retry with the same key: you will get the first "
        "request's answer."
    )

    def __init__(self, message: str = "", retry_after: int = 1):
        super().__init__(message or f"Retry after {retry_after} s.")
        self.retry_after = retry_after


class LeaseLost(IdempotencyError):
    """The request ran past its lease and another took the key over; its result is not stored."""

    status = 409
    title = "The Idempotency-Key was taken over by a retry"
    type = "urn:problem:idempotency-lease-lost"
    remedy = "Retry with the same key: you will get the answer of the request that took the key over."


class DatabaseUnavailable(IdempotencyError):
    """The database connection failed while the request ran (a restart, a failover, a killed
    backend). Whatever the request did either committed together with its stored answer or not
    at all (or, for a view that is not atomic, stands as after any crash), so a retry is safe.

    Parameters
    ----------
    message : str
        The detail; by default one that says to retry.
    retry_after : int
        The seconds the client waits before it retries (its Retry-After).
    """

    status = 503
    title = "The database was unavailable"
    type = "urn:problem:idempotency-database-unavailable"
    remedy = (
        "Retry with the same key after the seconds in Retry-After: you get the stored answer if the "
        "request completed, a 409 while its lease runs out, then its one execution."
    )

    def __init__(self, message: str = "", retry_after: int = 1):
        super().__init__(message or "The database connection failed during this request; retry it.")
        self.retry_after = retry_after


class IdempotencyThrottled(IdempotencyError):
    """Too many requests answered by the idempotency layer itself (replays, keys in progress or
    reused, missing or malformed keys) for this principal: IDEMPOTENCY["THROTTLE_RATE"]."""

    status = 429
    title = "Too many requests"
    type = "urn:problem:idempotency-throttled"
    remedy = "Wait for the seconds in Retry-After, then retry with the same key."

    def __init__(self, message: str = "", retry_after: int = 1):
        super().__init__(message or f"Request was throttled. Expected available in {retry_after} seconds.")
        self.retry_after = retry_after


def documented_errors() -> dict[str, type[IdempotencyError]]:
    """The problem types of this app by their slug (`urn:problem:<slug>`), for their pages."""
    errors: list[type[IdempotencyError]] = [
        IdempotencyKeyMissing,
        IdempotencyKeyInvalid,
        IdempotencyKeyMismatch,
        IdempotencyInProgress,
        LeaseLost,
        DatabaseUnavailable,
        IdempotencyThrottled,
    ]
    return {error.type.rpartition(":")[2]: error for error in errors}
