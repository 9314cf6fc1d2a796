"""The gateway's uses of library internals, one adapter module per library (docs/design/adapters.md).

- `gateway.adapters.channels`: channels' session wrapper and `as_asgi()` attributes, and Django's
  URL patterns as channels-style routing matches them (gateway.asgi, gateway.consumers).
- `gateway.adapters.uvicorn_protocols`: uvicorn's websockets-sansio protocol, subclassed to keep less per
  socket (gateway.uvicorn), and the error its send raises once the client is gone
  (gateway.servers).

Each module asks `exactly_once.internals.internals()` once, at import, and binds either its fast
path or a fallback written against the library's public API; callers import what it binds and
never check a version themselves. Its docstring names the internal, the figure that justified
it, the release range tested, and the fallback.
"""
