"""The admin of jobs' stage records: read-only (runs write them), a failed stage's traceback
shown to staff with the view permission. Every permission is the model's own: a user without
`eventbus.view_stagerecord` sees nothing of them, nobody adds or edits one, and deleting one (a
re-run then does its stage again) takes `eventbus.delete_stagerecord`.

Dead letters are not rows but entries of Redis streams, one `{domain:shard}:dead` per shard
(eventbus.keys). They get the admin the way Django projects give it to data outside the
database: an unmanaged model without a table (eventbus.models.DeadLetter, its migration creating
none), whose ModelAdmin serves its own list page (get_urls, changelist_view) read through
eventbus.redrive. So they sit in the admin's index with the other models, and every access goes
through model permissions that migrate creates and that groups are given as usual:
`eventbus.view_deadletter` shows the list (403 without it), and the custom
`eventbus.redrive_deadletter` (rather than `change`, which would say nothing of what it does)
allows the Redrive button: a CSRF-checked POST that calls redrive(), the service of the
`eventbus_redrive` command, for one domain. Redrive is per domain, not per selected letter: a
job's letters must go back in seq order, which redrive() keeps; malformed ones stay, as with
the command. The list shows each shard's oldest SHOWN_PER_SHARD letters and every shard's count.
"""

from datetime import UTC, datetime

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.timesince import timesince
from redis.exceptions import RedisError

from .delivery import streams_for
from .jobtypes import domains as all_domains
from .models import DeadLetter, StageRecord
from .redis import get_redis
from .redrive import dead_letters, redrive

REDRIVE_PERMISSION = "redrive_deadletter"
SHOWN_PER_SHARD = 200


@admin.register(StageRecord)
class StageRecordAdmin(admin.ModelAdmin):
    list_display = (
        "operation_id",
        "stage",
        "attempts",
        "started_at",
        "finished_at",
        "error_type",
        "failed_at",
        "next_attempt_at",
    )
    list_filter = ("stage", "error_type")
    # A job's id, whole or in part (the operation's op_id is its primary key).
    search_fields = ("operation__op_id",)
    list_select_related = False
    ordering = ("-started_at",)
    fields = (
        "operation",
        "stage",
        "attempts",
        "started_at",
        "finished_at",
        "result",
        "events",
        "error_type",
        "error_message",
        "failed_at",
        "next_attempt_at",
        "traceback",
    )
    readonly_fields = fields

    @admin.display(description="traceback")
    def traceback(self, record):
        if not record.error_traceback:
            return "-"
        return format_html("<pre>{}</pre>", record.error_traceback)

    def has_add_permission(self, request):
        return False  # a run makes them

    def has_change_permission(self, request, obj=None):
        return False  # what a run recorded stays as it was; the view permission shows it


@admin.register(DeadLetter)
class DeadLetterAdmin(admin.ModelAdmin):
    """Dead letters: every domain's and shard's, read from Redis (eventbus.redrive), with a
    Redrive button per domain. See the module docstring for why it is built this way."""

    def get_urls(self):
        # Only these two pages: the model has no table, so Django's add, change, delete and
        # history pages (which query it) do not exist.
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", self.admin_site.admin_view(self.changelist_view), name=f"{name}_changelist"),
            path("redrive/", self.admin_site.admin_view(self.redrive_view), name=f"{name}_redrive"),
        ]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_redrive_permission(self, request) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{REDRIVE_PERMISSION}")

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        domains = []
        try:
            client = get_redis()
            for domain in all_domains():
                streams = streams_for([domain])
                total = sum(client.xlen(stream.dead_letters) for stream in streams)
                letters = dead_letters(domain, client=client, limit=SHOWN_PER_SHARD) if total else []
                domains.append((domain, total, [self._row(letter) for letter in letters]))
        except RedisError as exc:
            self.message_user(request, f"Redis did not answer: {exc}", messages.ERROR)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Dead letters",
            "domains": domains,
            "shown_per_shard": SHOWN_PER_SHARD,
            "can_redrive": self.has_redrive_permission(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/eventbus/deadletter/change_list.html", context)

    def redrive_view(self, request):
        """POST (CSRF-checked by admin_view) {domain}: the eventbus_redrive command's service."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_redrive_permission(request):
            raise PermissionDenied
        domain = request.POST.get("domain", "")
        if domain not in all_domains():
            self.message_user(request, f"No domain {domain!r}.", messages.ERROR)
        else:
            try:
                letters = redrive(domain)
            except RedisError as exc:
                self.message_user(request, f"Redis did not answer: {exc}", messages.ERROR)
            else:
                done = sum(1 for letter in letters if letter.new_id)
                kept = sum(1 for letter in letters if letter.malformed)
                self.message_user(
                    request,
                    f"Re-drove {done} of {len(letters)} dead letter(s) of {domain}; {kept} malformed kept.",
                    messages.SUCCESS,
                )
        return HttpResponseRedirect(reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist"))

    @staticmethod
    def _row(letter) -> dict:
        dead_at = datetime.fromtimestamp(letter.dead_at_ms / 1000, tz=UTC)
        return {
            "shard": letter.shard,
            "original_stream_id": letter.original_stream_id,
            "job_id": letter.job_id or "-",
            "seq": "-" if letter.seq is None else letter.seq,
            "reason": letter.reason,
            "deliveries": "-" if letter.deliveries is None else letter.deliveries,
            "dead_at": dead_at,
            "age": timesince(dead_at),
            "malformed": letter.malformed,
        }
