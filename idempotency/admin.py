"""The admin of idempotency records: read-only views and two actions on keys (the jobs' admin is
the event bus's: eventbus.admin).

Each action declares the model permission it needs (Django then neither offers it nor runs a
forged POST of it without that permission): evicting a key deletes its record, so it needs
`delete`; expiring one changes it, so `change`. Either makes the owner's next retry execute
the view again, which a member who may only view the records must not be able to cause.
A stored answer goes through format_html: it is text, never markup.

The change permission is the actions', not a form's: a record's page is read-only for everyone
(no Save button, and a POST of it refused), since a saved form would write back a row the
middleware changes meanwhile. The list is newest first.
"""

import json

from django.contrib import admin, messages
from django.utils import timezone
from django.utils.html import format_html

from .conf import idempotency_settings
from .models import IdempotencyRecord

# A stored answer can be as large as the view made it: the page shows its start.
SHOWN_BYTES = 64 * 1024
# A key or a request path in the list: its start (the record's page shows all of it).
SHOWN_KEY_CHARS = 24


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _minute(moment) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M") if moment else "-"


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(admin.ModelAdmin):
    # Narrow columns, so that the list fits beside the filters at 1280 px: a key's start (search
    # takes all of it), the request in one column, times to the minute.
    list_display = ("short_key", "scope", "state", "request", "status", "created", "expires")
    list_filter = ("state", "method", "response_status", "created_at")
    search_fields = ("key", "scope", "path", "fingerprint")
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-pk")
    actions = ("expire_now", "evict")
    readonly_fields = [f.name for f in IdempotencyRecord._meta.fields if f.name != "response_body"] + [
        "stored_response"
    ]
    exclude = ("response_body",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        # A record given: no form edits it. Without one, Django asks whether expire_now (a change
        # action) is offered: the model's permission.
        return obj is None and super().has_change_permission(request)

    @admin.display(description="key", ordering="key")
    def short_key(self, record):
        return format_html('<span title="{}">{}</span>', record.key, _cut(record.key, SHOWN_KEY_CHARS))

    @admin.display(description="request")
    def request(self, record):
        return _cut(f"{record.method} {record.path}", SHOWN_KEY_CHARS)

    @admin.display(description="status", ordering="response_status")
    def status(self, record):
        return record.response_status or "-"

    @admin.display(description="created at", ordering="created_at")
    def created(self, record):
        return _minute(record.created_at)

    @admin.display(description="expires at", ordering="expires_at")
    def expires(self, record):
        return _minute(record.expires_at)

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
