"""The bus's room: publishing job events exactly once (publish, the Lua scripts in lua/), the
key layout (keys), the stream entries and their events (events), and the long-running processes
that route, reclaim and re-drive them (router, reclaimer, delivery, redrive), with the loop and
the clean stops they share (loop, stopping, consolelog). See docs/design/code-map.md."""
