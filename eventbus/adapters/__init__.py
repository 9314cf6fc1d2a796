"""The event bus's and the gateway's adapters over library internals (docs/design/adapters.md): one module per
library, each asking `exactly_once.internals.internals()` once and falling back to the public API."""
