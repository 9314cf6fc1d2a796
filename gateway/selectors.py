from idempotency.models import Operation


def visible_operations(user):
    """A user sees their own jobs; staff see every job."""
    if not user.is_authenticated:
        return Operation.objects.none()
    if user.is_staff:
        return Operation.objects.all()
    return Operation.objects.filter(owner=user)
