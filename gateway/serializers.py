"""The jobs API's bodies: the request (a registered job type and the payload its type accepts),
the list's filters, and the jobs as the API shows them (the list's items, the detail with its
stages); the problem body too, for the schema (gateway.openapi).

A payload is refused (400) when it nests deeper than GATEWAY["PAYLOAD_MAX_DEPTH"] or holds a
NUL character in a key or a string: PostgreSQL's jsonb cannot store one (a 500 there, a 201 on
SQLite), so no database gets one.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework import serializers

from eventbus.jobtypes import registry
from eventbus.models import STAGE_STATES, Job
from eventbus.selectors import retry_id

from .conf import gateway_settings

NUL = "\x00"


def payload_problem(payload, max_depth: int) -> str | None:
    """Why the payload cannot be stored alike on every database, or None. Walked with a stack,
    not recursion: the payload may be as deep as the parser allowed."""
    stack = [(payload, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, dict):
            items = list(value.items())
        elif isinstance(value, list):
            items = list(enumerate(value))
        else:
            if isinstance(value, str) and NUL in value:
                return f"A string holds a NUL character (\\u0000), at {path or '/'}."
            continue
        if depth > max_depth:
            return f"The payload is nested deeper than {max_depth} levels, at {path or '/'}."
        for key, item in items:
            if isinstance(key, str) and NUL in key:
                return f"A key holds a NUL character (\\u0000), in {path or '/'}."
            stack.append((item, depth + 1, f"{path}/{key}"))
    return None


# How far ahead a request may delay a job's start (run_after), either way it is given.
MAX_RUN_AFTER = timedelta(days=31)


class RunAfterField(serializers.Field):
    """A delayed start: an ISO 8601 date and time with its offset (a time at most MAX_RUN_AFTER
    from now; a past one: now), or a number of seconds from now (0 to MAX_RUN_AFTER). Gives a
    datetime or a timedelta, as start_job's run_after takes them. Its OpenAPI description is
    gateway.openapi's (describe_fields)."""

    default_error_messages = {
        "invalid": "Not a delayed start: an ISO 8601 date and time with its offset "
        "(2030-01-01T09:00:00+00:00), or a number of seconds from now.",
        "naive": "The date and time needs its offset (Z, or +01:00...): it names no instant otherwise.",
        "too_far": f"At most {MAX_RUN_AFTER.days} days from now.",
        "negative": "A number of seconds from now: 0 or more.",
    }

    def to_internal_value(self, data) -> datetime | timedelta:
        if isinstance(data, bool):
            self.fail("invalid")
        if isinstance(data, (int, float)):
            if not math.isfinite(data):
                self.fail("invalid")
            if data < 0:
                self.fail("negative")
            if data > MAX_RUN_AFTER.total_seconds():
                self.fail("too_far")
            return timedelta(seconds=data)
        if not isinstance(data, str):
            self.fail("invalid")
        try:
            moment = parse_datetime(data.strip())
        except ValueError:  # well formed, out of range (a 25th hour, an offset past 24 h)
            moment = None
        if moment is None:
            self.fail("invalid")
        if timezone.is_naive(moment):
            self.fail("naive")
        try:
            moment = moment.astimezone(UTC)
        except OverflowError:  # year 1 or 9999 moved across its offset
            self.fail("too_far")
        if moment > timezone.now() + MAX_RUN_AFTER:
            self.fail("too_far")
        return moment

    def to_representation(self, value):
        return value.isoformat() if isinstance(value, datetime) else value.total_seconds()


class JobRequestSerializer(serializers.Serializer):
    """A job to start: its type, the payload its type reads (a JSON object) and, optionally,
    when it starts (run_after)."""

    domain = serializers.ChoiceField(choices=(), help_text="The job's type.")
    payload = serializers.DictField(required=False, default=dict)
    run_after = RunAfterField(
        required=False,
        help_text="A delayed start: an ISO 8601 date and time with its offset, or a number of seconds "
        f"from now (0 to {int(MAX_RUN_AFTER.total_seconds())}); at most {MAX_RUN_AFTER.days} days ahead. "
        "The job stays PENDING until then.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # When asked, not at import: a project's types register later. Only the types a request
        # may start (a django.tasks task's job names code to run: only code starts one).
        known = sorted(name for name, job_type in registry().items() if job_type.startable_by_api)
        self.fields["domain"].choices = known
        self.fields["domain"].error_messages["invalid_choice"] = f"Not a job type: choose one of {known}."

    def validate_payload(self, value):
        problem = payload_problem(value, gateway_settings.PAYLOAD_MAX_DEPTH)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value

    # The type's clean_payload runs in eventbus.start_job, which the view calls.


# -- the list's filters -------------------------------------------------------------------------


class JobFilterSerializer(serializers.Serializer):
    # A state or a domain outside the known ones is a 400, as any bad input (a NUL character
    # among them: it never reaches the database). Empty (`?state=`, as an HTML form sends an
    # unset select): no filter.
    state = serializers.ChoiceField(choices=Job.State.choices, required=False, allow_blank=True)
    domain = serializers.ChoiceField(choices=(), required=False, allow_blank=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["domain"].choices = sorted(registry())


# -- jobs as the API shows them -----------------------------------------------------------------


def ws_url(job, request) -> str:
    scheme = "wss" if request.is_secure() else "ws"
    return f"{scheme}://{request.get_host()}/ws/jobs/{job.id}/"


class StageErrorSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="The exception's type, e.g. ValueError.")
    message = serializers.CharField(allow_blank=True, help_text="What it said (at most 1,000 characters).")


class JobErrorSerializer(StageErrorSerializer):
    stage = serializers.CharField(allow_null=True, help_text="null: the job failed outside its stages.")


WAITING_FOR_HELP = (
    'What it waits for: "sleep", "signal:<name>" (several names: "signal:approve,reject") or '
    '"children"; null: nothing.'
)


class StageSerializer(serializers.Serializer):
    name = serializers.CharField()
    # DRF takes declared fields off the class: no clash with Field.label or Serializer.errors.
    label = serializers.CharField()  # type: ignore[assignment]
    state = serializers.ChoiceField(choices=STAGE_STATES)
    attempts = serializers.IntegerField(min_value=0, help_text="Runs that started the stage.")
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    error = StageErrorSerializer(
        allow_null=True,
        help_text="The last failure of an attempt, until an attempt finishes the stage; null for a "
        "stage a cancel stopped (CANCELLED).",
    )
    waiting_for = serializers.CharField(allow_null=True, help_text=WAITING_FOR_HELP)


class JobAcceptedSerializer(serializers.Serializer):
    """A job as it is accepted: what a client needs to watch it."""

    job_id = serializers.UUIDField(source="id")
    domain = serializers.CharField()
    state = serializers.ChoiceField(choices=Job.State.choices)
    ws_url = serializers.SerializerMethodField(help_text="Its events, live: ws(s)://host/ws/jobs/<job_id>/")

    def get_ws_url(self, job) -> str:
        return ws_url(job, self.context["request"])


class JobSerializer(JobAcceptedSerializer):
    """A job as the list shows it: no payload, no stages."""

    accepted_at = serializers.DateTimeField()
    run_after = serializers.DateTimeField(
        allow_null=True,
        help_text="A delayed start: the job stays PENDING until then; for a WAITING job, when it "
        "resumes (a sleep's end, a signal's timeout). Null: none.",
    )
    completed_at = serializers.DateTimeField(allow_null=True)
    retry_of = serializers.SerializerMethodField(help_text="The job this one retries, if it is a retry.")
    retried_by = serializers.SerializerMethodField(
        help_text="The job that retries this one (a job has at most one retry), or null."
    )
    # DRF takes declared fields off the class: no clash with Field.parent.
    parent = serializers.SerializerMethodField(  # type: ignore[assignment]
        help_text="The job whose stage started this one (ctx.start_child), or null."
    )

    def get_retry_of(self, job) -> uuid.UUID | None:
        return job.retry_of_id

    def get_parent(self, job) -> uuid.UUID | None:
        return job.parent_id

    def get_retried_by(self, job) -> uuid.UUID | None:
        # The selectors annotate it (job_list, visible_job: no query per row); read it otherwise.
        if hasattr(job, "retried_by"):
            return job.retried_by
        return retry_id(job)


class JobChildSerializer(serializers.Serializer):
    """A job a stage of this one started."""

    job_id = serializers.UUIDField(source="id")
    domain = serializers.CharField()
    state = serializers.ChoiceField(choices=Job.State.choices)


class JobDetailSerializer(JobSerializer):
    """A job with its payload, latest event, error, stages, children, the signals it takes and
    what it waits for: it reads the job's detail as
    eventbus.selectors.job_detail gives it (a JobDetail value, its stages StageDetail values)."""

    payload = serializers.DictField()
    latest_event = serializers.DictField(
        allow_null=True, help_text="The newest event published (while Redis keeps it: EVENTBUS['STATE_TTL'])."
    )
    error = JobErrorSerializer(allow_null=True, help_text="Why a FAILED job failed; null otherwise.")
    stages = StageSerializer(many=True, help_text="Every stage of the job's type, in order.")
    children = JobChildSerializer(
        many=True, help_text="The jobs its stages started (ctx.start_child), oldest first."
    )
    signals = serializers.ListField(
        child=serializers.CharField(),
        help_text="The signals its type declares: POST /api/jobs/<job_id>/signals/<name>/ sends one.",
    )
    waiting_for = serializers.CharField(
        allow_null=True, help_text=f"{WAITING_FOR_HELP} (Of its waiting stage; null once it ended.)"
    )


class SignalSentSerializer(serializers.Serializer):
    """A signal sent to a job (POST /api/jobs/<job_id>/signals/<name>/)."""

    job_id = serializers.UUIDField()
    signal = serializers.CharField(help_text="Its name.")
    sent_at = serializers.DateTimeField(help_text="When it was sent (its first sending, on a replay).")
    delivered = serializers.BooleanField(help_text="Whether a waiting stage has taken it yet.")


class ProblemSerializer(serializers.Serializer):
    """An error body, application/problem+json (RFC 9457)."""

    type = serializers.CharField(help_text="A URI naming the problem; about:blank for plain HTTP statuses.")
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField(allow_blank=True)
    errors = serializers.JSONField(  # type: ignore[assignment]
        required=False, help_text="Per field, what is wrong (a 400 on bad input)."
    )
    retried_by = serializers.UUIDField(
        required=False, help_text="The job's retry, on a 409 to retry a job retried already."
    )
    signals = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="The signals the job takes, on a 400 for a signal it does not.",
    )
    signal = serializers.CharField(required=False, help_text="The signal, on a 409: it was sent already.")
