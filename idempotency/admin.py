"""The admin of idempotency records and operations: read-only views, two actions on keys, and
two on jobs (with the event bus installed).

Each action declares the model permission it needs (Django then neither offers it nor runs a
forged POST of it without that permission): evicting a key deletes its record, so it needs
`delete`; expiring one changes it, so `change`. Either makes the owner's next retry execute
the view again, which a member who may only view the records must not be able to cause.
Cancelling or retrying a job (eventbus.services) changes what runs: `change` too.
"""

import json

from django.apps import apps
from django.contrib import admin, messages
from django.utils import timezone
from django.utils.html import format_html

from .conf import idempotency_settings
from .models import IdempotencyRecord, Operation

# A stored answer can be as large as the view made it: the page shows its start.
SHOWN_BYTES = 64 * 1024


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(admin.ModelAdmin):
    list_display = ("key", "scope", "state", "method", "path", "response_status", "created_at", "expires_at")
    list_filter = ("state", "method", "response_status", "created_at")
    search_fields = ("key", "scope", "path", "fingerprint")
    date_hierarchy = "created_at"
    actions = ("expire_now", "evict")
    readonly_fields = [f.name for f in IdempotencyRecord._meta.fields if f.name != "response_body"] + [
        "stored_response"
    ]
    exclude = ("response_body",)

    def has_add_permission(self, request):
        return False

    @admin.display(description="stored response")
    def stored_response(self, record):
        if record.response_status is None:
            return "-"
        body = bytes(record.response_body or b"")
        shown = body[:SHOWN_BYTES]
        try:
            text = json.dumps(json.loads(shown), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError):  # not JSON, cut short, or nested past the parser's limit
            text = shown.decode("utf-8", "replace")
        if len(body) > SHOWN_BYTES:
            text += f"\n… {len(body) - SHOWN_BYTES} more bytes not shown"
        headers = "\n".join(f"{name}: {value}" for name, value in record.response_headers)
        return format_html("<pre>HTTP {}\n{}\n\n{}</pre>", record.response_status, headers, text)

    @admin.action(permissions=["change"], description="Expire the selected keys now (a retry executes again)")
    def expire_now(self, request, queryset):
        store = idempotency_settings.STORE()
        pairs = list(queryset.values_list("scope", "key"))
        queryset.update(expires_at=timezone.now())
        for scope, key in pairs:
            store.forget(scope=scope, key=key)
        self.message_user(request, f"Expired {len(pairs)} key(s).", messages.SUCCESS)

    @admin.action(
        permissions=["delete"], description="Evict the selected keys (delete them and their cached answers)"
    )
    def evict(self, request, queryset):
        store = idempotency_settings.STORE()
        pairs = list(queryset.values_list("scope", "key"))
        for scope, key in pairs:
            store.evict(scope=scope, key=key)
        self.message_user(request, f"Evicted {len(pairs)} key(s).", messages.SUCCESS)


@admin.register(Operation)
class OperationAdmin(admin.ModelAdmin):
    list_display = (
        "op_id",
        "domain",
        "event_type",
        "state",
        "owner",
        "idem_key",
        "accepted_at",
        "completed_at",
    )
    list_filter = ("state", "domain", "event_type", "accepted_at")
    search_fields = ("op_id", "idem_key", "biz_key", "scope", "owner__username")
    date_hierarchy = "accepted_at"
    readonly_fields = [f.name for f in Operation._meta.fields]
    raw_id_fields = ("owner",)
    actions = ("cancel_jobs", "retry_jobs")

    def has_add_permission(self, request):
        return False

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not apps.is_installed("eventbus"):  # the jobs' services are the event bus's
            actions.pop("cancel_jobs", None)
            actions.pop("retry_jobs", None)
        return actions

    @admin.action(permissions=["change"], description="Cancel the selected jobs")
    def cancel_jobs(self, request, queryset):
        from eventbus.services import cancel_job

        cancelled = ended = 0
        for job_id in queryset.values_list("op_id", flat=True):
            try:
                cancel_job(job_id)
                cancelled += 1
            except Exception as exc:  # JobEnded, or the job deleted meanwhile
                ended += 1
                self.message_user(request, f"{job_id}: {exc}", messages.WARNING)
        self.message_user(request, f"Cancelled {cancelled} job(s); {ended} had ended.", messages.SUCCESS)

    @admin.action(
        permissions=["change"], description="Retry the selected jobs (FAILED, TIMED_OUT or CANCELLED)"
    )
    def retry_jobs(self, request, queryset):
        from eventbus.services import retry_job, retry_key

        retried = 0
        for job in queryset.only("op_id"):
            try:
                # The bulk key: the command and this action retry each job once between them.
                new, created = retry_job(job.op_id, key=retry_key(job))
            except Exception as exc:  # JobNotRetryable, the owner's running cap
                self.message_user(request, f"{job.op_id}: {exc}", messages.WARNING)
                continue
            retried += created
        self.message_user(request, f"Retried {retried} job(s).", messages.SUCCESS)
