from django.db import models
from django.utils import timezone

from idempotency.models import Operation


class StageRecord(models.Model):
    """One stage of one job: how many runs started it and, once it finished, its result and
    the events it reported. A re-run of the job skips a finished stage and reuses these."""

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="stage_records")
    stage = models.CharField(max_length=64)
    attempts = models.PositiveIntegerField(default=0, help_text="runs that started this stage")
    result = models.JSONField(null=True, blank=True)
    # [[stage, seq, data], ...] in the order they were published.
    events = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation", "stage"], name="stage_record_operation_stage")
        ]

    def __str__(self):
        return f"{self.operation_id} {self.stage} ({'finished' if self.finished_at else 'in flight'})"

    @property
    def finished(self) -> bool:
        return self.finished_at is not None
