"""The admin of jobs (under "Jobs": jobs, stage records, dead letters), every action and page
behind the model's permissions.

Jobs are read-only: the list by state and type, newest first; a job's page shows whose keys it
is under (its owner), its stages as a timeline (each declared stage of its type, in order, from its
StageRecord) and its events (those its stages recorded, the durable source, and its final event
from Redis while the bus keeps it), and the jobs of its retry chain as links. Cancelling or
retrying jobs (eventbus.services) changes what runs: the actions need `eventbus.change_job`.
That permission is the actions', never a form's: a job's page has no Save button for anyone
(a saved form would write back a row its run changes meanwhile: POSTing it is refused) and no
Delete link (ended jobs go with `cleanup_jobs`).
Everything shown goes through format_html: a payload, an error message or an event's data is
text, never markup.

A job's stages may wait (WAITING: a sleep, a signal, its children): its timeline says what for,
its page links its parent and its children (ctx.start_child) and lists the signals sent to it
(JobSignal, read-only, shown with `eventbus.view_jobsignal`). The action "Send a signal" (the
change permission, as the other actions) asks on a page of its own which of the jobs' declared
signals, with what JSON payload, and sends it to each selected job (eventbus.signal_job) under a
key made when that page is shown: submitting the same page twice sends one signal.

Stage records are read-only too (runs write them), a failed stage's traceback shown to staff
with the view permission. Every permission is the model's own: a user without
`eventbus.view_stagerecord` sees nothing of them, nobody adds or edits one, and deleting one (a
re-run then does its stage again) takes `eventbus.delete_stagerecord`.

Dead letters are not rows but entries of Redis streams, one `{domain:shard}:dead` per shard
(eventbus.bus.keys). They get the admin the way Django projects give it to data outside the
database: an unmanaged model without a table (eventbus.models.DeadLetter, its migration creating
none), whose ModelAdmin serves its own list page (get_urls, changelist_view) read through
eventbus.bus.redrive. So they sit in the admin's index with the other models, and every access goes
through model permissions that migrate creates and that groups are given as usual:
`eventbus.view_deadletter` shows the list (403 without it), and the custom
`eventbus.redrive_deadletter` (rather than `change`, which would say nothing of what it does)
allows the Redrive button: a CSRF-checked POST that calls redrive(), the service of the
`eventbus_redrive` command, for one domain. Redrive is per domain, not per selected letter: a
job's letters must go back in seq order, which redrive() keeps; malformed ones stay, as with
the command, and its message names them. The list shows each shard's oldest SHOWN_PER_SHARD
letters and every shard's count; a malformed letter (anyone who can write to Redis can add one)
is listed as such, with its raw fields shortened and escaped, never a 500.
"""

import json
import uuid
from datetime import UTC, datetime
from urllib.parse import unquote

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join
from django.utils.timesince import timesince
from redis.exceptions import RedisError

from eventbus.bus.delivery import streams_for
from eventbus.bus.redrive import dead_letters, redrive
from eventbus.exceptions import JobAlreadyRetried, JobServiceError
from eventbus.jobtypes import InvalidPayload
from eventbus.jobtypes import domains as all_domains
from eventbus.models import DeadLetter, Job, JobSignal, StageRecord
from eventbus.redis.clients import get_redis
from eventbus.selectors import job_signal_names, job_stages, latest_event
from eventbus.services import cancel_job, owner_scope, retry_as_operator, signal_job
from exactly_once.jsontext import nested_deeper_than
from idempotency.exceptions import IdempotencyKeyMismatch
from idempotency.keys import InvalidKey

REDRIVE_PERMISSION = "redrive_deadletter"
SHOWN_PER_SHARD = 200
# The malformed letters a redrive kept that its message names (by dead-letter id).
NAMED_KEPT = 10
# An event's data on a job's page: its start, so that a job of many events stays one page.
SHOWN_EVENT_CHARS = 200
# A stage's error type in the stage records' list: its start (its page shows all of it).
SHOWN_ERROR_CHARS = 30
# A job's children on its page: the first ones as links, then a link to the list of all of them.
SHOWN_CHILDREN = 50


class JobTypeFilter(admin.AllValuesFieldListFilter):
    """The domain filter, named for what it is to an operator: the job's type."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.title = "job type"


class SignalForm(forms.Form):
    """The action "Send a signal": which of the jobs' declared signals, its payload, and the key
    made when the page was shown (a second submission of that page is the same signal)."""

    signal = forms.ChoiceField(help_text="One the job's type declares (Stage(signals=...)).")
    payload = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 5, "cols": 60, "spellcheck": "false"}),
        help_text="A JSON object: what the stage's ctx.wait_for returns. Empty: {}.",
    )
    key = forms.CharField(max_length=255, widget=forms.HiddenInput)

    def __init__(self, *args, signals: tuple[str, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        choice = self.fields["signal"]
        assert isinstance(choice, forms.ChoiceField)
        choice.choices = [(name, name) for name in signals]

    def clean_payload(self):
        text = self.cleaned_data["payload"].strip() or "{}"
        try:
            payload = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise forms.ValidationError(f"Not JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise forms.ValidationError("A JSON object: {...}.")
        if nested_deeper_than(payload, text):
            raise forms.ValidationError("Nested too deep.")
        return payload


class JobSignalInline(admin.TabularInline):
    """The signals sent to a job, read-only (the model's view permission shows them)."""

    model = JobSignal
    fields = ("name", "payload", "idem_key", "sent_by", "sent_at", "delivered_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("sent_at", "pk")
    verbose_name_plural = "signals"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("sent_by")  # one query for the rows

    def has_add_permission(self, request, obj=None):
        return False  # signal_job sends them (the action, the jobs API)

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Jobs, read-only: the list by state and type; a job's page shows whose it is, its stages as
    a timeline, its events and the jobs of its retry chain. See the module docstring."""

    # Narrow columns, so that the list fits beside the filters at 1280 px: a job's id and the
    # one it retries as their first 8 characters (search takes a part of an id), its acceptance
    # to the minute, its key on its page only (search takes it too).
    list_display = ("short_id", "domain", "state", "owner", "accepted", "duration", "retried_job")
    ordering = ("-accepted_at", "-id")  # newest first; the id settles jobs accepted together
    list_filter = ("state", ("domain", JobTypeFilter), "event_type", "accepted_at")
    list_select_related = ("owner",)  # the owner column: one query for the page, not one a row
    search_fields = ("id", "idem_key", "biz_key", "owner__username")
    date_hierarchy = "accepted_at"
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "domain",
                    "event_type",
                    "state",
                    "owner",
                    "keyspace",
                    "idem_key",
                    "biz_key",
                    "payload",
                    "queue",
                    "priority",
                    "accepted_at",
                    "run_after",
                    "enqueued_at",
                    "started_at",
                    "ended_at",
                    "duration",
                    "deadline",
                    "cancel_requested_at",
                    "retry_of_link",
                    "retries_links",
                    "parent_link",
                    "children_links",
                )
            },
        ),
        ("Stages", {"fields": ("timeline",)}),
        ("Events", {"fields": ("events",)}),
    )
    readonly_fields = [f.name for f in Job._meta.fields] + [
        "keyspace",
        "duration",
        "ended_at",
        "retry_of_link",
        "retries_links",
        "parent_link",
        "children_links",
        "timeline",
        "events",
    ]
    raw_id_fields = ("owner",)
    inlines = (JobSignalInline,)
    actions = ("cancel_jobs", "retry_jobs", "signal_jobs")

    @admin.display(description="job")
    def short_id(self, job):
        return format_html('<span title="{}">{}</span>', job.id, str(job.id)[:8])

    @admin.display(description="accepted at", ordering="accepted_at")
    def accepted(self, job):
        return timezone.localtime(job.accepted_at).strftime("%Y-%m-%d %H:%M")

    @admin.display(description="ended at")
    def ended_at(self, job):
        """completed_at, which every final state sets (FAILED, CANCELLED... as well as COMPLETED):
        named for what it is."""
        return formats.localize(timezone.localtime(job.completed_at)) if job.completed_at else "-"

    @admin.display(description="duration")
    def duration(self, job):
        """From acceptance to the end (or to now, for a job not ended)."""
        return _duration(job.accepted_at, job.completed_at or timezone.now()) if job.accepted_at else "-"

    @admin.display(description="keys of")
    def keyspace(self, job):
        """Whose keyspace the job's key lives in, as a person reads it: its owner's (the scope the
        jobs API and start_job give it), or the tenant and principal of another scope."""
        owner = f"{job.owner} (user {job.owner_id})" if job.owner_id else "no owner"
        if job.scope == owner_scope(job.owner):
            return owner
        tenant, _, principal = job.scope.partition(":")
        return f"{owner}; tenant {unquote(tenant)}, principal {unquote(principal) or '-'}"

    @admin.display(description="retry of")
    def retried_job(self, job):
        # The id, not the job: that would be a query per row.
        if not job.retry_of_id:
            return "-"
        return format_html('<span title="{}">{}</span>', job.retry_of_id, str(job.retry_of_id)[:8])

    @admin.display(description="retry of")
    def retry_of_link(self, job):
        return _job_link(job.retry_of_id) if job.retry_of_id else "-"

    @admin.display(description="retried by")
    def retries_links(self, job):
        retries = list(job.retries.order_by("accepted_at").values_list("pk", "state"))
        if not retries:
            return "-"
        return format_html_join(", ", "{} ({})", ((_job_link(pk), state) for pk, state in retries))

    @admin.display(description="parent")
    def parent_link(self, job):
        """The job whose stage started this one (ctx.start_child)."""
        return _job_link(job.parent_id) if job.parent_id else "-"

    @admin.display(description="children")
    def children_links(self, job):
        """The jobs its stages started, oldest first, each with its state: the first
        SHOWN_CHILDREN, then a link to the list of all of them."""
        children = list(
            job.children.order_by("accepted_at", "pk").values_list("pk", "state")[: SHOWN_CHILDREN + 1]
        )
        if not children:
            return "-"
        links = format_html_join(
            ", ", "{} ({})", ((_job_link(pk), state) for pk, state in children[:SHOWN_CHILDREN])
        )
        if len(children) <= SHOWN_CHILDREN:
            return links
        every = f"{reverse('admin:eventbus_job_changelist')}?parent__id__exact={job.pk}"
        return format_html('{}, <a href="{}">all {}</a>', links, every, job.children.count())

    @admin.display(description="timeline")
    def timeline(self, job):
        rows = job_stages(job)
        if not rows:
            return "-"
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            "<td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (_stage_cells(index, row) for index, row in enumerate(rows, 1)),
        )
        return format_html(
            "<table><thead><tr><th>#</th><th>stage</th><th>state</th><th>attempts</th><th>started</th>"
            "<th>finished</th><th>failed</th><th>next attempt</th><th>waiting for</th><th>duration</th>"
            "<th>error</th></tr></thead><tbody>{}</tbody></table>",
            body,
        )

    @admin.display(description="events")
    def events(self, job):
        """The events its stages recorded (durable), then its final event from Redis while the
        bus keeps it (EVENTBUS["STATE_TTL"])."""
        events = [
            (seq, stage, data)
            for record in job.stage_records.order_by("started_at", "pk")
            for stage, seq, data in record.events
        ]
        events.sort(key=lambda event: event[0])
        latest = latest_event(job.domain, str(job.id))
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

    def has_change_permission(self, request, obj=None):
        # No job is edited through a form (its page is read-only for everyone): a job given, no.
        # Without one, Django asks whether the change actions are offered: the model's permission.
        return obj is None and super().has_change_permission(request)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return super().change_view(
            request, object_id, form_url, {"show_delete": False, **(extra_context or {})}
        )

    def get_actions(self, request, action_location=None):
        # Django 6.1 says where the actions show (change list or change form) and deprecates an
        # override without the parameter; 5.2 and 6.0 have no such parameter.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)
        return actions

    @admin.action(permissions=["change"], description="Cancel the selected jobs")
    def cancel_jobs(self, request, queryset):
        cancelled = ended = 0
        for job_id in queryset.values_list("id", flat=True):
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
        retried = 0
        for job in queryset.select_related(None).only("id"):  # the list's join is not needed
            try:
                # The bulk key, in the operators' scope: the command and this action retry each
                # job once between them, and no user's job under that key blocks them.
                new, created = retry_as_operator(job)
            except JobAlreadyRetried as exc:
                self.message_user(request, f"{job.id}: already retried as {exc.retried_by}", messages.INFO)
                continue
            except Exception as exc:  # JobNotRetryable, the owner's caps
                self.message_user(request, f"{job.id}: {exc}", messages.WARNING)
                continue
            retried += created
        self.message_user(request, f"Retried {retried} job(s).", messages.SUCCESS)

    @admin.action(permissions=["change"], description="Send a signal to the selected jobs")
    def signal_jobs(self, request, queryset):
        """A page of its own (SignalForm) asks which signal, with what payload; its submission
        sends it to each selected job whose type declares it."""
        jobs = list(queryset.select_related(None).only("id", "domain", "state"))
        signals = tuple(dict.fromkeys(name for job in jobs for name in job_signal_names(job.domain)))
        if not signals:
            self.message_user(request, "The selected jobs' types declare no signal.", messages.WARNING)
            return None
        if "send" in request.POST:
            form = SignalForm(request.POST, signals=signals)
            if form.is_valid():
                self._send_signal(request, jobs, **form.cleaned_data)
                return None
        else:
            # Made once, as the page is shown: submitting it again (a double click, the browser's
            # resend) gives the same key, and the same signal.
            form = SignalForm(signals=signals, initial={"key": f"admin:{uuid.uuid4()}", "payload": "{}"})
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Send a signal",
            "jobs": jobs,
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media + form.media,
        }
        return TemplateResponse(request, "admin/eventbus/job/signal.html", context)

    def _send_signal(self, request, jobs, *, signal: str, payload: dict, key: str) -> None:
        sent = again = 0
        for job in jobs:
            try:
                _sent, created = signal_job(job.id, signal, payload, key=key, sent_by=request.user)
            except (
                JobServiceError,
                InvalidPayload,
                IdempotencyKeyMismatch,
                InvalidKey,
                Job.DoesNotExist,
            ) as exc:
                # UnknownSignal (its type declares another), SignalAlreadySent, JobEnded, too large.
                self.message_user(request, f"{job.id}: {exc}", messages.WARNING)
                continue
            sent += created
            again += not created
        replayed = f" ({again} sent before with this key)" if again else ""
        self.message_user(
            request, f"Sent the signal {signal} to {sent + again} job(s){replayed}.", messages.SUCCESS
        )


def _job_link(pk):
    return format_html('<a href="{}">{}</a>', reverse("admin:eventbus_job_change", args=[pk]), pk)


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
        return (index, f"{row.label} ({row.name})", row.state, 0, "-", "-", "-", "-", "-", "-", "")
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
        record.waiting_for or "-",
        _duration(record.started_at, record.finished_at),
        error,
    )


def _shorten(data) -> str:
    text = json.dumps(data, ensure_ascii=False, default=str)
    return text if len(text) <= SHOWN_EVENT_CHARS else text[:SHOWN_EVENT_CHARS] + "…"


@admin.register(StageRecord)
class StageRecordAdmin(admin.ModelAdmin):
    # Narrow columns, so that the list fits beside the filters at 1280 px: the job's id as its
    # first 8 characters, the record's state (instead of its finished, failed and next-attempt
    # times, which its page shows), the error's type cut short.
    list_display = ("short_job_id", "stage", "state", "attempts", "started", "error")
    list_filter = ("stage", "error_type")
    # A job's id, whole or in part.
    search_fields = ("job__id",)
    list_select_related = False
    ordering = ("-started_at", "-pk")  # newest first
    fields = (
        "job",
        "stage",
        "attempts",
        "started_at",
        "finished_at",
        "result",
        "events",
        "workers",
        "error_type",
        "error_class",
        "error_message",
        "failed_at",
        "next_attempt_at",
        "waiting_for",
        "waits",
        "traceback",
    )
    readonly_fields = fields

    @admin.display(description="job")
    def short_job_id(self, record):
        return format_html('<span title="{}">{}</span>', record.job_id, str(record.job_id)[:8])

    @admin.display(description="state")
    def state(self, record):
        return record.state

    @admin.display(description="started at", ordering="started_at")
    def started(self, record):
        return timezone.localtime(record.started_at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="error", ordering="error_type")
    def error(self, record):
        error = record.error_type or "-"
        return error if len(error) <= SHOWN_ERROR_CHARS else error[:SHOWN_ERROR_CHARS] + "…"

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
    """Dead letters: every domain's and shard's, read from Redis (eventbus.bus.redrive), with a
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
                kept = [letter for letter in letters if letter.malformed]
                self.message_user(
                    request,
                    f"Re-drove {done} of {len(letters)} dead letter(s) of {domain}; {len(kept)} malformed kept.",
                    messages.SUCCESS,
                )
                if kept:
                    named = ", ".join(f"{letter.dead_key} {letter.dead_id}" for letter in kept[:NAMED_KEPT])
                    more = f" and {len(kept) - NAMED_KEPT} more" if len(kept) > NAMED_KEPT else ""
                    self.message_user(request, f"Malformed, kept: {named}{more}.", messages.WARNING)
        return HttpResponseRedirect(reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist"))

    @staticmethod
    def _row(letter) -> dict:
        dead_at = datetime.fromtimestamp(letter.dead_at_ms / 1000, tz=UTC)
        return {
            "shard": letter.shard,
            "dead_id": letter.dead_id,
            "original_stream_id": letter.original_stream_id or "-",
            "job_id": letter.job_id or "-",
            "seq": "-" if letter.seq is None else letter.seq,
            "reason": letter.reason or "-",
            "deliveries": "-" if letter.deliveries is None else letter.deliveries,
            "dead_at": dead_at,
            "age": timesince(dead_at),
            "malformed": letter.malformed,
            # What Redis holds, shortened (eventbus.bus.redrive.shortened): the page escapes it.
            "raw_fields": letter.raw_fields if letter.malformed else (),
        }
