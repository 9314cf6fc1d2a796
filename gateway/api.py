"""The jobs API: POST /api/jobs/ (Idempotency-Key required), GET /api/jobs/ (the user's jobs,
filtered, paginated), GET /api/jobs/<job_id>/ (one job with its stages), POST
/api/jobs/<job_id>/cancel/ and /retry/, POST /api/jobs/<job_id>/signals/<name>/: thin calls of
the job services (eventbus.services), every read of a job through eventbus.selectors.
Throttled (scope "jobs", gateway.throttling) and described by an OpenAPI schema (gateway.openapi)."""

from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from eventbus import InvalidPayload, cancel_job, retry_job, signal_job, start_job
from eventbus.exceptions import JobServiceError
from eventbus.models import Job
from eventbus.selectors import job_detail, job_list, visible_job
from idempotency.decorators import idempotency_key
from idempotency.exceptions import IdempotencyKeyMismatch
from idempotency.problems import problem, problem_from_error

from .conf import gateway_settings
from .openapi import documented
from .pagination import JobPagination
from .parsers import JSONParser
from .serializers import (
    JobDetailSerializer,
    JobFilterSerializer,
    JobRequestSerializer,
    JobSerializer,
    SignalSentSerializer,
    payload_problem,
    ws_url,
)
from .throttling import SCOPE, JobsThrottle


def job_body(job, request):
    return {
        "job_id": str(job.id),
        "domain": job.domain,
        "state": job.state,
        "ws_url": ws_url(job, request),
    }


# DRF's default parsers, with a body nested too deep for Python's JSON parser a 400 (gateway.parsers).
JOB_PARSERS = [JSONParser, FormParser, MultiPartParser]


class JobsView(APIView):
    # Whatever the project's REST_FRAMEWORK defaults: jobs belong to a user.
    permission_classes = [IsAuthenticated]
    parser_classes = JOB_PARSERS
    throttle_scope = SCOPE

    def get_throttles(self):
        # The project's own throttles, and the jobs API's in place of a ScopedRateThrottle of
        # the project's: that one would count this scope again under the same cache key (or
        # fail every request of a project without a "jobs" rate).
        own = [
            throttle for throttle in super().get_throttles() if not isinstance(throttle, ScopedRateThrottle)
        ]
        return [*own, JobsThrottle()]


@documented
class JobListView(JobsView):
    pagination_class = JobPagination

    def get(self, request):
        filters = JobFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(job_list(request.user, **filters.validated_data), request, self)
        items = JobSerializer(page, many=True, context={"request": request}).data
        return paginator.get_paginated_response(items)

    @idempotency_key("required", atomic=True)
    def post(self, request):
        serializer = JobRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        context = request.idempotency
        try:
            job, _created = start_job(
                serializer.validated_data["domain"],
                serializer.validated_data["payload"],
                key=context.key,
                owner=request.user,
                scope=context.scope,
                run_after=serializer.validated_data.get("run_after"),
            )
        except InvalidPayload as exc:
            raise serializers.ValidationError({"payload": exc.errors}) from None
        except IdempotencyKeyMismatch as exc:
            return problem_from_error(exc)
        except JobServiceError as exc:
            return service_problem(exc)
        return Response(job_body(job, request), status=status.HTTP_201_CREATED)


@documented
class JobDetailView(JobsView):
    def get(self, request, job_id):
        detail = job_detail(request.user, job_id)  # a value: its latest event, error and stages too
        if detail is None:
            raise NotFound("No such job.")
        return Response(JobDetailSerializer(detail, context={"request": request}).data)


def service_problem(error: JobServiceError):
    """A job service's refusal (an ended job, a job not retryable or retried already, the caps)
    as its problem, with the error's extension members (`retried_by`)."""
    response = problem(
        error.status, str(error), title=error.title, type=error.problem_type, **error.problem_members()
    )
    retry_after = getattr(error, "retry_after", None)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


# Another user's job, seen through the view permission, is acted on with the change permission.
CHANGE_EVERY_JOB = "eventbus.change_job"


def job_to_act_on(request, job_id) -> Job:
    """The job, if the user sees it (404 otherwise) and may act on it (their own, or with the
    job model's change permission: 403 otherwise)."""
    job = visible_job(request.user, job_id)
    if job is None:
        raise NotFound("No such job.")
    if job.owner_id != request.user.pk and not request.user.has_perm(CHANGE_EVERY_JOB):
        raise PermissionDenied("You may see this job, not act on it.")
    return job


@documented
class JobCancelView(JobsView):
    """POST: cancel the job (202 with its body); an ended job, 409 problem."""

    @idempotency_key("optional")
    def post(self, request, job_id):
        job = job_to_act_on(request, job_id)
        try:
            job = cancel_job(job.id)
        except JobServiceError as exc:
            return service_problem(exc)
        return Response(job_body(job, request), status=status.HTTP_202_ACCEPTED)


@documented
class JobRetryView(JobsView):
    """POST (Idempotency-Key required): a new job retrying this one (201 with its body, the same
    job on a replay); a job not FAILED, TIMED_OUT or CANCELLED, 409 problem."""

    @idempotency_key("required", atomic=True)
    def post(self, request, job_id):
        job = job_to_act_on(request, job_id)
        context = request.idempotency
        try:
            # The job's owner owns its retry too (an operator's retry shows among the user's jobs).
            new, _created = retry_job(job.id, key=context.key, owner=job.owner, scope=context.scope)
        except IdempotencyKeyMismatch as exc:
            return problem_from_error(exc)
        except JobServiceError as exc:
            return service_problem(exc)
        body = job_body(new, request)
        body["retry_of"] = str(job.id)
        return Response(body, status=status.HTTP_201_CREATED)


@documented
class JobSignalView(JobsView):
    """POST (Idempotency-Key required; the body, a JSON object, is the signal's payload, an empty
    body `{}`): send the signal `name` to the job (202), which a stage's ctx.wait_for(name) takes.
    A name its type does not declare, 400; sent already under another key, or an ended job, 409."""

    parser_classes = [JSONParser]  # the body is the payload: JSON only

    @idempotency_key("required", atomic=True)
    def post(self, request, job_id, name):
        job = job_to_act_on(request, job_id)
        payload = request.data
        if not isinstance(payload, dict):
            raise serializers.ValidationError({"payload": "A signal's payload is a JSON object."})
        problem_text = payload_problem(payload, gateway_settings.PAYLOAD_MAX_DEPTH)
        if problem_text is not None:
            raise serializers.ValidationError({"payload": problem_text})
        try:
            sent, _created = signal_job(
                job.id, name, payload, key=request.idempotency.key, sent_by=request.user
            )
        except InvalidPayload as exc:
            raise serializers.ValidationError({"payload": exc.errors}) from None
        except IdempotencyKeyMismatch as exc:
            return problem_from_error(exc)
        except JobServiceError as exc:
            return service_problem(exc)
        except Job.DoesNotExist:  # deleted meanwhile (cleanup_jobs)
            raise NotFound("No such job.") from None
        body = {
            "job_id": job.id,
            "signal": sent.name,
            "sent_at": sent.sent_at,
            "delivered": sent.delivered_at is not None,
        }
        return Response(SignalSentSerializer(body).data, status=status.HTTP_202_ACCEPTED)
