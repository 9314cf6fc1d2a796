"""The event bus's and the gateway's adapters over library internals (SPEC §10): one module per
library, each asking `idempotency.adapters.internals()` once and falling back to the public API."""
