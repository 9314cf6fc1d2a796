"""How long ended jobs are kept: `delete_ended_jobs` removes the jobs (eventbus.models.Job)
that ended longer than EVENTBUS["KEEP_ENDED_JOBS"] seconds ago, with their stage records, in
batches; the `cleanup_jobs` command runs it. A PENDING or RUNNING job is never deleted, nor one
whose end has no time (completed_at unset).

Deleting a job frees its (scope, Idempotency-Key): the same key may then start a new job. Keep
jobs at least as long as the idempotency records that replay their answers (IDEMPOTENCY["TTL"]).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from eventbus.models import Job, StageRecord
from idempotency.transactions import write_transaction

BATCH_SIZE = 500


@dataclass(frozen=True)
class Deleted:
    jobs: int
    stage_records: int


def ended_jobs(*, older_than: timedelta, now: datetime | None = None):
    """The jobs in a final state that ended before now - older_than."""
    cutoff = (now or timezone.now()) - older_than
    return Job.objects.filter(state__in=Job.FINAL_STATES, completed_at__lt=cutoff)


def delete_ended_jobs(
    *, older_than: timedelta, now: datetime | None = None, batch_size: int = BATCH_SIZE, dry_run: bool = False
) -> Deleted:
    """Delete the jobs `ended_jobs` selects and their stage records, `batch_size` jobs per
    transaction (a long table is never locked at once); with `dry_run`, only count them."""
    jobs = ended_jobs(older_than=older_than, now=now)
    if dry_run:
        return Deleted(jobs.count(), StageRecord.objects.filter(job__in=jobs).count())
    total_jobs = total_records = 0
    while batch := list(jobs.values_list("pk", flat=True)[:batch_size]):
        # On SQLite, the write lock first: Django's cascade reads the batch before it deletes.
        with write_transaction():
            # The batch's rows, checked again: a job cannot leave a final state, but the filter
            # keeps the delete to what was selected whatever happens meanwhile.
            _, counts = jobs.filter(pk__in=batch).delete()  # cascades to StageRecord
        total_jobs += counts.get(Job._meta.label, 0)
        total_records += counts.get(StageRecord._meta.label, 0)
    return Deleted(total_jobs, total_records)
