"""Which jobs a user may see, for the jobs API and the job stream alike."""

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
