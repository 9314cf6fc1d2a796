"""Errors raised by the idempotency layer, each with the HTTP status it maps to."""


class IdempotencyError(Exception):
    status = 400
    title = "Idempotency error"
    type = "about:blank"


class IdempotencyKeyMismatch(IdempotencyError):
    """The key was used before for another request (another body, query string, route or call)."""

    status = 422
    title = "Idempotency-Key reused with another request"
    type = "urn:problem:idempotency-key-mismatch"


class IdempotencyInProgress(IdempotencyError):
    """Another request holds the key's lease and is still running."""

    status = 409
    title = "A request with this Idempotency-Key is in progress"
    type = "urn:problem:idempotency-in-progress"

    def __init__(self, message: str = "", retry_after: int = 1):
        super().__init__(message or f"Retry after {retry_after} s.")
        self.retry_after = retry_after


class LeaseLost(IdempotencyError):
    """The request ran past its lease and another took the key over; its result is not stored."""

    status = 409
    title = "The Idempotency-Key was taken over by a retry"
    type = "urn:problem:idempotency-lease-lost"
