"""A deleted record never replays, however it was deleted: the admin's bulk delete, any
QuerySet.delete(), cleanup or eviction. The store forgets its copies outside the database."""

from django.db import transaction
from django.db.models.signals import post_delete

from .conf import idempotency_settings
from .models import IdempotencyRecord


def forget_deleted_record(sender, instance, using, **kwargs):
    store = idempotency_settings.STORE()
    store.forget(scope=instance.scope, key=instance.key)
    # Again once the delete commits: until then a concurrent request may still read the record
    # from the database and put its answer back in the cache.
    transaction.on_commit(
        lambda: store.forget(scope=instance.scope, key=instance.key), using=using, robust=True
    )


def connect() -> None:
    post_delete.connect(
        forget_deleted_record, sender=IdempotencyRecord, dispatch_uid="idempotency.forget_deleted"
    )
