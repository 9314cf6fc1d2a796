import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone


class IdempotencyRecord(models.Model):
    """One Idempotency-Key of one scope: its lease while a request runs, then the stored answer."""

    class State(models.TextChoices):
        PENDING = "PENDING", "in progress"
        COMPLETED = "COMPLETED", "completed"
        FAILED = "FAILED", "failed (retryable)"

    scope = models.CharField(max_length=255, help_text="tenant:principal, or fn:<operation>")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    method = models.CharField(max_length=16, blank=True)
    path = models.TextField(blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    # The lease: whoever holds the token may complete or fail the record, until another takes it over.
    lease_token = models.CharField(max_length=32, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_headers = models.JSONField(default=list, blank=True)
    response_body = models.BinaryField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "key"], name="idempotency_record_scope_key")]
        verbose_name = "idempotency record"

    def __str__(self):
        return f"{self.scope} {self.key} ({self.state})"


class Operation(models.Model):
    """An accepted command (a job): exactly one per (scope, Idempotency-Key)."""

    class State(models.TextChoices):
        PENDING = "PENDING"
        RUNNING = "RUNNING"
        COMPLETED = "COMPLETED"
        FAILED = "FAILED"
        TIMED_OUT = "TIMED_OUT"
        CANCELLED = "CANCELLED"

    op_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    scope = models.CharField(max_length=255)
    idem_key = models.CharField(max_length=255)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="operations"
    )
    domain = models.CharField(max_length=32)
    event_type = models.CharField(max_length=64)
    biz_key = models.CharField(max_length=255, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    payload = models.JSONField(default=dict, blank=True)
    accepted_at = models.DateTimeField(default=timezone.now)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    # The job this one retries (eventbus.retry_job): it reuses that job's finished stages, and
    # its stages' keys are those of the first job of the chain.
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries"
    )
    # eventbus.cancel_job asked the running job to stop; its run ends it CANCELLED.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "idem_key"], name="operation_scope_idem_key")]
        indexes = [
            models.Index(fields=["owner", "-accepted_at"]),
            models.Index(fields=["state", "enqueued_at"]),
        ]

    def __str__(self):
        return f"{self.domain} {self.op_id} ({self.state})"
