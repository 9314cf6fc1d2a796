"""The jobs API's bodies: the request (a registered job type and the payload its type accepts),
the list's filters, and the jobs as the API shows them (the list's items, the detail with its
stages); the problem body too, for the schema (gateway.openapi).

A payload is refused (400) when it nests deeper than GATEWAY["PAYLOAD_MAX_DEPTH"] or holds a
NUL character in a key or a string: PostgreSQL's jsonb cannot store one (a 500 there, a 201 on
SQLite), so no database gets one.
"""

from __future__ import annotations

import uuid

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


class JobRequestSerializer(serializers.Serializer):
    """A job to start: its type and the payload its type reads (a JSON object)."""

    domain = serializers.ChoiceField(choices=(), help_text="The job's type.")
    payload = serializers.DictField(required=False, default=dict)

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
        allow_null=True, help_text="A delayed start: the job stays PENDING until then (null: none)."
    )
    completed_at = serializers.DateTimeField(allow_null=True)
    retry_of = serializers.SerializerMethodField(help_text="The job this one retries, if it is a retry.")
    retried_by = serializers.SerializerMethodField(
        help_text="The job that retries this one (a job has at most one retry), or null."
    )

    def get_retry_of(self, job) -> uuid.UUID | None:
        return job.retry_of_id

    def get_retried_by(self, job) -> uuid.UUID | None:
        # The selectors annotate it (job_list, visible_job: no query per row); read it otherwise.
        if hasattr(job, "retried_by"):
            return job.retried_by
        return retry_id(job)


class JobDetailSerializer(JobSerializer):
    """A job with its payload, latest event, error and stages: it reads the job's detail as
    eventbus.selectors.job_detail gives it (a JobDetail value, its stages StageDetail values)."""

    payload = serializers.DictField()
    latest_event = serializers.DictField(
        allow_null=True, help_text="The newest event published (while Redis keeps it: EVENTBUS['STATE_TTL'])."
    )
    error = JobErrorSerializer(allow_null=True, help_text="Why a FAILED job failed; null otherwise.")
    stages = StageSerializer(many=True, help_text="Every stage of the job's type, in order.")


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
