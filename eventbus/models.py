from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

from idempotency.models import Operation

# A stage's states, as StageRecord.state names them; PENDING is a declared stage with no record.
STAGE_STATES = ("PENDING", "RUNNING", "RETRYING", "COMPLETED", "FAILED")


class StageRecord(models.Model):
    """One stage of one job: how many runs started it and, once it finished, its result and
    the events it reported. A re-run of the job skips a finished stage and reuses these."""

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="stage_records")
    stage = models.CharField(max_length=64)
    attempts = models.PositiveIntegerField(default=0, help_text="runs that started this stage")
    # The stage's result in its JSON form (eventbus.stages.recorded).
    result = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    # [[stage, seq, data], ...] in the order they were published (data as the bus encodes it).
    events = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The last failure of an attempt of the stage (eventbus.stages.describe), until an attempt
    # finishes it: its type and message are the job's error as its owner sees it; the traceback
    # is for staff (the admin).
    error_type = models.CharField(max_length=200, null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    error_traceback = models.TextField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    # A failed attempt whose retry waits (Stage.retries): when it is due. Cleared when the
    # attempt starts. The recovery leaves a job alone while it waits.
    next_attempt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation", "stage"], name="stage_record_operation_stage")
        ]

    def __str__(self):
        status = "finished" if self.finished_at else "failed" if self.error_type else "in flight"
        return f"{self.operation_id} {self.stage} ({status})"

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def state(self) -> str:
        """COMPLETED, RETRYING (a failed attempt's retry waits), FAILED (its last attempt failed,
        or a cancel stopped it: error_type JobCancelled, and no retry waits) or RUNNING; a
        declared stage with no record is PENDING."""
        if self.finished_at is not None:
            return "COMPLETED"
        if self.next_attempt_at is not None:
            return "RETRYING"
        if self.failed_at is not None and self.failed_at >= self.started_at:
            return "FAILED"
        return "RUNNING"


class DeadLetter(models.Model):
    """No table: dead letters are entries of Redis streams (`{domain:shard}:dead`, read by
    eventbus.redrive). The model exists for the admin (eventbus.admin lists them) and for its
    permissions, which migrate creates as for any model: `view_deadletter` shows them, and
    `redrive_deadletter` puts them back on their streams. Never query it."""

    class Meta:
        managed = False
        default_permissions = ("view",)  # nobody adds, edits or deletes one through Django
        permissions = [("redrive_deadletter", "Can re-drive dead letters to their streams")]
        verbose_name = "dead letter"
