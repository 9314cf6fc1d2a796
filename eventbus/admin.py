"""The admin of jobs' stage records: read-only (runs write them), a failed stage's traceback
shown to staff with the view permission. Every permission is the model's own: a user without
`eventbus.view_stagerecord` sees nothing of them, nobody adds or edits one, and deleting one (a
re-run then does its stage again) takes `eventbus.delete_stagerecord`."""

from django.contrib import admin
from django.utils.html import format_html

from .models import StageRecord


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
