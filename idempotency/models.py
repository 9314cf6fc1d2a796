"""Idempotency's model: one record per (scope, Idempotency-Key), its lease, then its stored answer.

The rows accepted once per key through idempotency.services.accept_once (a job: eventbus.models.Job)
belong to the apps that define them."""

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
