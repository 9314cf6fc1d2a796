"""The job moves from idempotency (Operation) to the event bus (Job): state only.

Django's state learns the model here, on the table it has (`idempotency_operation`, its columns,
index and constraint names as they are), and StageRecord's foreign key points at it; then
idempotency's 0003 forgets Operation (`run_before`: idempotency never depends on the event bus,
which stays optional to it). Nothing changes in the database; 0006 renames the table, its
primary key, the stage records' column and the names of the indexes and constraints.
"""

import uuid

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("eventbus", "0004_deadletter"),
        ("idempotency", "0002_operation_retry_of_and_cancel"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]
    run_before = [("idempotency", "0003_job_moves_to_eventbus")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Job",
                    fields=[
                        (
                            "op_id",
                            models.UUIDField(
                                default=uuid.uuid4, editable=False, primary_key=True, serialize=False
                            ),
                        ),
                        ("scope", models.CharField(max_length=255)),
                        ("idem_key", models.CharField(max_length=255)),
                        ("domain", models.CharField(max_length=32)),
                        ("event_type", models.CharField(max_length=64)),
                        ("biz_key", models.CharField(blank=True, max_length=255)),
                        (
                            "state",
                            models.CharField(
                                choices=[
                                    ("PENDING", "Pending"),
                                    ("RUNNING", "Running"),
                                    ("COMPLETED", "Completed"),
                                    ("FAILED", "Failed"),
                                    ("TIMED_OUT", "Timed Out"),
                                    ("CANCELLED", "Cancelled"),
                                ],
                                default="PENDING",
                                max_length=16,
                            ),
                        ),
                        ("payload", models.JSONField(blank=True, default=dict)),
                        ("accepted_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("enqueued_at", models.DateTimeField(blank=True, null=True)),
                        ("completed_at", models.DateTimeField(blank=True, null=True)),
                        ("deadline", models.DateTimeField(blank=True, null=True)),
                        ("cancel_requested_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "owner",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="jobs",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "retry_of",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="retries",
                                to="eventbus.job",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "idempotency_operation",
                        "indexes": [
                            models.Index(
                                fields=["owner", "-accepted_at"], name="idempotency_owner_i_0bb70b_idx"
                            ),
                            models.Index(
                                fields=["state", "enqueued_at"], name="idempotency_state_67b8b3_idx"
                            ),
                        ],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("scope", "idem_key"), name="operation_scope_idem_key"
                            )
                        ],
                    },
                ),
                migrations.AlterField(
                    model_name="stagerecord",
                    name="operation",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="stage_records",
                        to="eventbus.job",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
