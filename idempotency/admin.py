"""The admin of idempotency records and operations: read-only views, two actions on keys, and
two on jobs (with the event bus installed).

Each action declares the model permission it needs (Django then neither offers it nor runs a
forged POST of it without that permission): evicting a key deletes its record, so it needs
`delete`; expiring one changes it, so `change`. Either makes the owner's next retry execute
the view again, which a member who may only view the records must not be able to cause.
Cancelling or retrying a job (eventbus.services) changes what runs: `change` too.

A job's page is read-only: whose keyspace its key is in, its stages as a timeline (each declared
stage of its type, in order, from its StageRecord) and its events (those its stages recorded,
the durable source, and its final event from Redis while the bus keeps it), and the jobs of its
retry chain as links. Everything shown goes through format_html: a payload, an error message
or an event's data is text, never markup.
"""

import json
from datetime import datetime
from urllib.parse import unquote

from django.apps import apps
from django.contrib import admin, messages
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from .conf import idempotency_settings
from .models import IdempotencyRecord, Operation

# A stored answer can be as large as the view made it: the page shows its start.
SHOWN_BYTES = 64 * 1024
# An event's data on a job's page: its start, so that a job of many events stays one page.
SHOWN_EVENT_CHARS = 200


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


class JobTypeFilter(admin.AllValuesFieldListFilter):
    """The domain filter, named for what it is to an operator: the job's type."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.title = "job type"


@admin.register(Operation)
class OperationAdmin(admin.ModelAdmin):
    """Jobs, read-only: the list by state and type; a job's page shows whose it is, its stages as
    a timeline and its events (with the event bus installed), and the jobs of its retry chain."""

    list_display = ("op_id", "domain", "state", "owner", "accepted_at", "duration", "idem_key", "retried_job")
    list_filter = ("state", ("domain", JobTypeFilter), "event_type", "accepted_at")
    list_select_related = ("owner",)  # the owner column: one query for the page, not one a row
    search_fields = ("op_id", "idem_key", "biz_key", "scope", "owner__username")
    date_hierarchy = "accepted_at"
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "op_id",
                    "domain",
                    "event_type",
                    "state",
                    "owner",
                    "keyspace",
                    "idem_key",
                    "biz_key",
                    "payload",
                    "accepted_at",
                    "enqueued_at",
                    "completed_at",
                    "duration",
                    "deadline",
                    "cancel_requested_at",
                    "retry_of_link",
                    "retries_links",
                )
            },
        ),
        ("Stages", {"fields": ("timeline",)}),
        ("Events", {"fields": ("events",)}),
    )
    readonly_fields = [f.name for f in Operation._meta.fields] + [
        "keyspace",
        "duration",
        "retry_of_link",
        "retries_links",
        "timeline",
        "events",
    ]
    raw_id_fields = ("owner",)
    actions = ("cancel_jobs", "retry_jobs")

    @admin.display(description="duration")
    def duration(self, job):
        """From acceptance to the end (or to now, for a job not ended)."""
        return _duration(job.accepted_at, job.completed_at or timezone.now()) if job.accepted_at else "-"

    @admin.display(description="keys' scope")
    def keyspace(self, job):
        """The scope as a person reads it: whose keyspace the job's key lives in."""
        tenant, _, principal = job.scope.partition(":")
        owner = f"{job.owner} (user {job.owner_id})" if job.owner_id else "no owner"
        return f"{owner}; tenant {unquote(tenant)}, principal {unquote(principal) or '-'} ({job.scope})"

    @admin.display(description="retry of")
    def retried_job(self, job):
        return job.retry_of_id or "-"  # the id: the job itself would be a query per row

    @admin.display(description="retry of")
    def retry_of_link(self, job):
        return _job_link(job.retry_of_id) if job.retry_of_id else "-"

    @admin.display(description="retried by")
    def retries_links(self, job):
        retries = list(job.retries.order_by("accepted_at").values_list("pk", "state"))
        if not retries:
            return "-"
        return format_html_join(", ", "{} ({})", ((_job_link(pk), state) for pk, state in retries))

    @admin.display(description="timeline")
    def timeline(self, job):
        if not apps.is_installed("eventbus"):
            return "-"
        from eventbus.selectors import job_stages

        rows = job_stages(job)
        if not rows:
            return "-"
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            "<td>{}</td><td>{}</td><td>{}</td></tr>",
            (_stage_cells(index, row) for index, row in enumerate(rows, 1)),
        )
        return format_html(
            "<table><thead><tr><th>#</th><th>stage</th><th>state</th><th>attempts</th><th>started</th>"
            "<th>finished</th><th>failed</th><th>next attempt</th><th>duration</th><th>error</th>"
            "</tr></thead><tbody>{}</tbody></table>",
            body,
        )

    @admin.display(description="events")
    def events(self, job):
        """The events its stages recorded (durable), then its final event from Redis while the
        bus keeps it (EVENTBUS["STATE_TTL"])."""
        if not apps.is_installed("eventbus"):
            return "-"
        from eventbus.selectors import latest_event

        events = [
            (seq, stage, data)
            for record in job.stage_records.order_by("started_at", "pk")
            for stage, seq, data in record.events
        ]
        events.sort(key=lambda event: event[0])
        latest = latest_event(job.domain, str(job.op_id))
        if (
            latest
            and isinstance(latest.get("seq"), int)
            and latest["seq"] > max((e[0] for e in events), default=0)
        ):
            events.append((latest["seq"], f"{latest.get('stage', '?')} (Redis)", latest.get("data")))
        if not events:
            return "-"
        return format_html(
            "<table><thead><tr><th>seq</th><th>stage</th><th>data</th></tr></thead><tbody>{}</tbody></table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
                ((seq, stage, _shorten(data)) for seq, stage, data in events),
            ),
        )

    def has_add_permission(self, request):
        return False

    def get_actions(self, request, action_location=None):
        # Django 6.1 says where the actions show (change list or change form) and deprecates an
        # override without the parameter; 5.2 and 6.0 have no such parameter.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)
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
        for job in queryset.select_related(None).only("op_id"):  # the list's join is not needed
            try:
                # The bulk key: the command and this action retry each job once between them.
                new, created = retry_job(job.op_id, key=retry_key(job))
            except Exception as exc:  # JobNotRetryable, the owner's running cap
                self.message_user(request, f"{job.op_id}: {exc}", messages.WARNING)
                continue
            retried += created
        self.message_user(request, f"Retried {retried} job(s).", messages.SUCCESS)


def _job_link(pk):
    return format_html('<a href="{}">{}</a>', reverse("admin:idempotency_operation_change", args=[pk]), pk)


def _duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "-"
    seconds = max((end - start).total_seconds(), 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes} min {seconds:02d} s"


def _when(moment: datetime | None) -> str:
    """To the millisecond, in the current time zone: a stage's times are seconds apart."""
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if moment else "-"


def _stage_cells(index: int, row) -> tuple:
    record = row.record
    if record is None:
        return (index, f"{row.label} ({row.name})", row.state, 0, "-", "-", "-", "-", "-", "")
    error = f"{record.error_type}: {record.error_message}" if record.error_type else ""
    return (
        index,
        f"{row.label} ({row.name})",
        row.state,
        record.attempts,
        _when(record.started_at),
        _when(record.finished_at),
        _when(record.failed_at),
        _when(record.next_attempt_at),
        _duration(record.started_at, record.finished_at),
        error,
    )


def _shorten(data) -> str:
    text = json.dumps(data, ensure_ascii=False, default=str)
    return text if len(text) <= SHOWN_EVENT_CHARS else text[:SHOWN_EVENT_CHARS] + "…"
