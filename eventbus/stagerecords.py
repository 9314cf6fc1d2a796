"""The writes of a job's stage records, each one statement.

A run writes a stage's start and its finish, and a finished stage costs one write (SPEC §9): the
finish of a stage also starts the next one (its attempts, started_at), in the same INSERT ... ON
CONFLICT DO UPDATE of two rows, which also reads whether the job was cancelled meanwhile (a
RETURNING subquery), the run's check before every stage. Only the first stage a run works on is
started on its own.

The conflict's update applies only to a record that is not finished: a run that outlived its
lease never overwrites the result and events another run finished the stage with, nor starts a
finished stage again.
"""

from __future__ import annotations

from django.db import connections

from idempotency.upsert import column, insert_statement

from .models import Job, StageRecord


def save(records: list[StageRecord]) -> bool:
    """Insert these records, or update the unfinished ones already there, in one statement;
    returns whether their job's cancel was requested (the database's word)."""
    sql, params, alias = insert_statement(records, target=("job", "stage"), update_unless="finished_at")
    connection = connections[alias]
    job_id = records[0].job_id
    with connection.cursor() as cursor:
        if connection.features.can_return_columns_from_insert:
            quote = connection.ops.quote_name
            pk = Job._meta.pk
            assert pk is not None
            cursor.execute(
                f"{sql} RETURNING (SELECT {quote(column(Job, 'cancel_requested_at'))} "
                f"FROM {quote(Job._meta.db_table)} WHERE {quote(column(Job, pk.name))} = %s)",
                [*params, pk.get_db_prep_value(job_id, connection)],
            )
            rows = cursor.fetchall()
            if rows:  # none when every record was finished already (a run that outlived its lease)
                return any(row[0] is not None for row in rows)
        else:
            cursor.execute(sql, params)
    return cancel_requested(job_id)


def cancel_requested(job_id) -> bool:
    """Whether the job's cancel was requested (the database's word: Redis may have lost the flag)."""
    return Job.objects.filter(pk=job_id, cancel_requested_at__isnull=False).exists()
