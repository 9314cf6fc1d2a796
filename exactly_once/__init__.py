"""The toolkit's shared core: what the three apps (idempotency, eventbus, gateway) all use and
none of them owns.

- `exactly_once.conf`: `AppSettings`, the one accessor shape of IDEMPOTENCY, EVENTBUS and GATEWAY;
- `exactly_once.internals`: the version gate `internals()` every library adapter asks, and
  `adapters_in_use()`;
- `exactly_once.upsert`: INSERT ... ON CONFLICT as one statement (accept_once, the stage records);
- `exactly_once.jsontext`: what JSON every database stores alike;
- `exactly_once.tracing`: the OpenTelemetry spans of all three (the `otel` extra), or nothing.

It is not a Django app (no models, no INSTALLED_APPS entry) and imports none of the three apps,
so each of them may import it; importing this package loads nothing at all.
"""
