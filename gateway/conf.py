"""GATEWAY settings, read through one accessor (see exactly_once.conf.AppSettings)."""

from exactly_once.conf import AppSettings

DEFAULTS = {
    # Live frames waiting for one socket while it catches up or its client's buffer is full; a
    # socket that falls this far behind is closed with 4008 (it resumes with last_seq, losing nothing).
    "QUEUE_SIZE": 1000,
    # How long a new socket waits for its channel subscription to be confirmed.
    "SUBSCRIBE_TIMEOUT": 5.0,
    # Connections for history and state reads, shared by every socket of the process.
    "READ_CONNECTIONS": 8,
    # Pause before the hub reconnects after Redis dropped its connection (doubles up to 2 s).
    "RECONNECT_DELAY": 0.05,
    # How deep a job's payload may nest (the payload object is level 1, each object or array in
    # it one more): a deeper one is refused with a 400 problem, as it would cost every reader of
    # it (the database's JSON, the stage's code) a recursion per level.
    "PAYLOAD_MAX_DEPTH": 32,
    # Seconds between two checks of the sessions of the process's sockets: a socket whose session
    # ended since it was authorized (a logout, a password change, the user deactivated) is closed
    # with 4401 within this. One bulk check per process (gateway.sessions). 0 or None: no checks.
    "SESSION_CHECK_SECONDS": 60,
    # Jobs per page of GET /api/jobs/ (gateway.pagination): a client asks for 1 to 100 with
    # `page_size`. (The jobs API's throttle rate is DRF's setting, REST_FRAMEWORK
    # ["DEFAULT_THROTTLE_RATES"]["jobs"], "120/min" when unset: gateway.throttling.)
    "JOBS_PAGE_SIZE": 20,
    # The most bytes a request body may have, refused with a 413 problem before it is read
    # (gateway.bodylimit: RequestBodyLimit under ASGI, RequestBodyLimitMiddleware under WSGI).
    # None: no limit. Above DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB), so that Django's own check
    # still answers a form that is too large, and a file upload of a few MB passes.
    "MAX_BODY_SIZE": 10 * 1024 * 1024,
    # Path prefixes with a limit of their own (the longest matching prefix wins; None: no limit):
    # {"/uploads/": 500 * 1024 * 1024}.
    "MAX_BODY_SIZE_BY_PATH": {},
    # Job stream sockets one user may hold open in one server process; the next one is closed with
    # 4429 (gateway.consumers). None or 0: no cap.
    "MAX_SOCKETS_PER_USER": 100,
}

gateway_settings = AppSettings("GATEWAY", DEFAULTS)
