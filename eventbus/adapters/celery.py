"""Celery's internals behind one gate (docs/design/adapters.md): a guard for a worker that exits on a broker
blip soon after one of its pool processes died.

Internal used: `celery.concurrency.asynpool.AsynPool._track_child_process`, wrapped, and the
pool process's `_sentinel_poll` read. A pool process whose exit was handled keeps
`_sentinel_poll = None` in the pool until billiard joins it. When the consumer restarts after a
lost broker connection, `AsynPool.register_with_event_loop` tracks every pool process again; for
that one `hub.add_reader(None)` raises in kombu's `fileno()` (ValueError from kombu 5.7,
AttributeError before it), which Celery's `iterate_file_descriptors_safely` does not catch (it
catches OSError), and the worker exits: "Unrecoverable error: ValueError('file descriptor is
None')". Found by tests/e2e (a pool process SIGKILLed mid-job, then CLIENT KILL of the broker
connection: the worker left and took its prefetched jobs' time with it; tests/e2e/REPORT.md).
Such a process is gone, so the wrapper does not track it; every other process is tracked as
before. A pool process dies whenever a task's hard time limit kills it, or the OOM killer does:
every worker that runs the toolkit's jobs (the users' own Celery apps too) meets this, hence the
guard lives here and not in a project's Celery module.

Applied once per worker process, on Celery's `worker_init` signal (connected by
`EventbusConfig.ready()`): the main process of `celery worker`, where the pool's event loop runs.
Other processes (web servers, `manage.py`) never import the pool.

Tested range: Celery 5.4 up to, not including, 5.7 and kombu 5.7 up to, not including, 5.8
(the code read in Celery 5.4.0 and 5.6.3, kombu 5.3.4 and 5.7.0; the suite runs 5.6.3 with
kombu 5.7.0). Celery 5.7.0 is excluded by the package's requirements (another crash on a broker
restart).

Fallback (outside that range, or EXACTLY_ONCE_INTERNALS=off): no guard; Celery as it is.
"""

from __future__ import annotations

import functools

from exactly_once.internals import internals

NAME = "eventbus.celery"


def decide() -> bool:
    """Whether the guard is applied: both Celery and kombu in the tested range."""
    return internals(NAME, "celery", "5.4", "5.7") and internals(NAME, "kombu", "5.7", "5.8")


INTERNALS = decide()


def skip_exited_pool_processes() -> bool:
    """Wrap AsynPool._track_child_process (once); True when it is wrapped."""
    from celery.concurrency import asynpool

    original = asynpool.AsynPool._track_child_process
    if getattr(original, "skips_exited", False):
        return True

    @functools.wraps(original)
    def _track_child_process(self, proc, hub):
        if getattr(proc, "_sentinel_poll", 0) is None:  # untracked when it exited: it is gone
            return None
        return original(self, proc, hub)

    _track_child_process.skips_exited = True  # type: ignore[attr-defined]
    asynpool.AsynPool._track_child_process = _track_child_process
    return True


def _on_worker_init(sender=None, **kwargs) -> None:
    skip_exited_pool_processes()


def connect() -> None:
    """Guard every Celery worker started in this process (on its worker_init signal); nothing
    outside the tested range."""
    if not INTERNALS:
        return
    from celery.signals import worker_init

    worker_init.connect(_on_worker_init, weak=False, dispatch_uid=NAME)
