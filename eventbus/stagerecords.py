"""The writes of a job's stage records, each one statement.

A run writes a stage's start and its finish, and a finished stage costs one write (SPEC §9): the
finish of a stage also starts the next one (its attempts, started_at), in the same INSERT ... ON
CONFLICT DO UPDATE of two rows. Only the first stage a run works on is started on its own.

The conflict's update applies only to a record that is not finished: a run that outlived its
lease never overwrites the result and events another run finished the stage with, nor starts a
finished stage again.
"""

from __future__ import annotations

from idempotency.upsert import insert

from .models import StageRecord


def save(records: list[StageRecord]) -> None:
    """Insert these records, or update the unfinished ones already there, in one statement."""
    insert(records, target=("operation", "stage"), update_unless="finished_at")
