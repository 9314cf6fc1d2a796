"""The demo project's own rows: what its jobs' atomic stages write (config.jobs), so that each
write can be counted, exactly once whatever the kills (tests/eventbus/test_atomic_stages.py, the
chaos harness)."""

from django.db import models


class LedgerEntry(models.Model):
    """One line of a job's ledger: written by an atomic stage (Stage(atomic=True)), in the
    transaction that records the stage finished."""

    job_id = models.UUIDField(db_index=True)
    stage = models.CharField(max_length=64)
    amount = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"{self.job_id} {self.stage} {self.amount}"
