"""The job's table and columns take its names: `idempotency_operation` becomes `eventbus_job`, its
primary key `op_id` becomes `id`, StageRecord's `operation_id` becomes `job_id`, and the indexes
and UNIQUE constraints are named after the job. Every row is kept (renames, on SQLite and
PostgreSQL alike; SQLite rebuilds a table to change a constraint, copying its rows).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("eventbus", "0005_job"),
        # Its state no longer has Operation: migrating idempotency back first undoes this one.
        ("idempotency", "0003_job_moves_to_eventbus"),
    ]

    operations = [
        migrations.AlterModelTable(name="job", table=None),
        migrations.RenameField(model_name="job", old_name="op_id", new_name="id"),
        migrations.RenameIndex(
            model_name="job", new_name="job_owner_accepted_at", old_name="idempotency_owner_i_0bb70b_idx"
        ),
        migrations.RenameIndex(
            model_name="job", new_name="job_state_enqueued_at", old_name="idempotency_state_67b8b3_idx"
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(fields=("scope", "idem_key"), name="job_scope_idem_key"),
        ),
        migrations.RemoveConstraint(model_name="job", name="operation_scope_idem_key"),
        # The constraint names the field: it goes before the rename and comes back after it.
        migrations.RemoveConstraint(model_name="stagerecord", name="stage_record_operation_stage"),
        migrations.RenameField(model_name="stagerecord", old_name="operation", new_name="job"),
        migrations.AddConstraint(
            model_name="stagerecord",
            constraint=models.UniqueConstraint(fields=("job", "stage"), name="stage_record_job_stage"),
        ),
    ]
