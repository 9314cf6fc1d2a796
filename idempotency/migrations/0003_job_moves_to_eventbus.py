"""Operation leaves idempotency: it is the event bus's Job now (eventbus.models.Job).

With the event bus installed, its migration 0005 has taken the model over (it runs before this
one: `run_before` there, so that idempotency depends on nothing of the event bus) and its 0006
renames the table; here Django's state forgets Operation, and the database keeps the table and
its rows for the event bus.

Without the event bus, nothing would own the table any more: it is dropped when it is empty,
and kept (with a warning) when it holds rows, which are then the project's to move or drop.
Migrating back recreates it if it was dropped.
"""

import warnings

from django.db import migrations

TABLE = "idempotency_operation"


def _owned_by_eventbus(apps) -> bool:
    try:
        apps.get_model("eventbus", "Job")
    except LookupError:
        return False
    return True


def drop_orphaned_table(apps, schema_editor):
    if _owned_by_eventbus(apps):
        return
    Operation = apps.get_model("idempotency", "Operation")
    if Operation.objects.using(schema_editor.connection.alias).exists():
        warnings.warn(
            f"idempotency: the table {TABLE} holds rows and no model owns it any more (jobs are "
            "the event bus's, which is not installed): it is kept for you to move or drop.",
            stacklevel=1,
        )
        return
    schema_editor.delete_model(Operation)


def recreate_orphaned_table(apps, schema_editor):
    if _owned_by_eventbus(apps):
        return
    if TABLE not in schema_editor.connection.introspection.table_names():
        schema_editor.create_model(apps.get_model("idempotency", "Operation"))


class Migration(migrations.Migration):
    dependencies = [
        ("idempotency", "0002_operation_retry_of_and_cancel"),
    ]

    operations = [
        migrations.RunPython(drop_orphaned_table, recreate_orphaned_table),
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="Operation")]),
    ]
