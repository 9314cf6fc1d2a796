"""Which jobs a user may see, for the jobs API and the job stream alike, and the reads of the
jobs API (HackSoft-style selectors: no writes here)."""

from eventbus.models import StageRecord
from idempotency.models import Operation

# The job model's view permission (superusers have it): it opens every user's jobs. is_staff
# alone opens none; it only lets a user into the admin, where model permissions rule too.
VIEW_EVERY_JOB = "idempotency.view_operation"


def visible_operations(user):
    """A user sees their own jobs; a user with the job model's view permission sees every job."""
    if not user.is_authenticated:
        return Operation.objects.none()
    if user.has_perm(VIEW_EVERY_JOB):
        return Operation.objects.all()
    return Operation.objects.filter(owner=user)


def job_list(user, *, state: str | None = None, domain: str | None = None):
    """The jobs `user` sees, newest first (the list shows no payload: it is not read)."""
    jobs = visible_operations(user)
    if state:
        jobs = jobs.filter(state=state)
    if domain:
        jobs = jobs.filter(domain=domain)
    # op_id breaks ties of one instant, so that pages neither repeat nor skip a job.
    return jobs.defer("payload").order_by("-accepted_at", "-op_id")


def stage_records(operation) -> list[StageRecord]:
    """The job's stage records, in one query (results, events and tracebacks, the large parts,
    are not read)."""
    return list(StageRecord.objects.filter(operation=operation).defer("result", "events", "error_traceback"))
