"""The jobs API: POST /api/jobs/ (Idempotency-Key required), GET /api/jobs/ (the user's jobs,
filtered, paginated), GET /api/jobs/<job_id>/ (one job with its stages), POST
/api/jobs/<job_id>/cancel/ and /retry/: thin calls of the job services (eventbus.services).
Throttled (scope "jobs", gateway.throttling) and described by an OpenAPI schema (gateway.openapi)."""

from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from eventbus.exceptions import JobServiceError
from eventbus.jobtypes import InvalidPayload
from eventbus.selectors import latest_event
from eventbus.services import cancel_job, retry_job, start_job
from eventbus.stages import recorded_failure
from idempotency.decorators import idempotency_key
from idempotency.exceptions import IdempotencyKeyMismatch
from idempotency.models import Operation
from idempotency.problems import problem, problem_from_error

from .openapi import documented
from .pagination import JobPagination
from .parsers import JSONParser
from .selectors import job_list, stage_records, visible_operations
from .serializers import (
    JobDetailSerializer,
    JobFilterSerializer,
    JobRequestSerializer,
    JobSerializer,
    job_stages,
    ws_url,
)
from .throttling import SCOPE, JobsThrottle


def job_body(operation, request):
    return {
        "job_id": str(operation.op_id),
        "domain": operation.domain,
        "state": operation.state,
        "ws_url": ws_url(operation, request),
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
            operation, _created = start_job(
                serializer.validated_data["domain"],
                serializer.validated_data["payload"],
                key=context.key,
                owner=request.user,
                scope=context.scope,
            )
        except InvalidPayload as exc:
            raise serializers.ValidationError({"payload": exc.errors}) from None
        except IdempotencyKeyMismatch as exc:
            return problem_from_error(exc)
        except JobServiceError as exc:
            return service_problem(exc)
        return Response(job_body(operation, request), status=status.HTTP_201_CREATED)


@documented
class JobDetailView(JobsView):
    def get(self, request, job_id):
        operation = visible_operations(request.user).filter(op_id=job_id).first()
        if operation is None:
            raise NotFound("No such job.")
        latest = latest_event(operation.domain, str(operation.op_id))
        # What the job's row does not hold, set on it for the serializer.
        operation.latest_event = latest
        records = stage_records(operation)  # one query: the stages and the job's error come from it
        operation.error = job_error(operation, latest, records)
        operation.stages = job_stages(operation, records)
        return Response(JobDetailSerializer(operation, context={"request": request}).data)


def job_error(operation, latest: dict | None, records) -> dict | None:
    """Why a FAILED job failed: {"stage", "type", "message"}, from the stage's record (stage
    None: it failed outside any stage, and only its final event, while Redis keeps it, says why)."""
    if operation.state != Operation.State.FAILED:
        return None
    failure = recorded_failure(records)
    if failure is None and latest is not None:
        data = latest.get("data")
        if isinstance(data, dict) and data.get("final") is True and isinstance(data.get("error"), dict):
            told = data["error"]  # read back from Redis: its shape is checked, not trusted
            stage = told.get("stage")
            failure = {
                "stage": stage if isinstance(stage, str) else None,
                "type": str(told.get("type", "")),
                "message": str(told.get("message", "")),
            }
    return failure


def service_problem(error: JobServiceError):
    """A job service's refusal (an ended job, a job not retryable, the running cap) as its problem."""
    response = problem(error.status, str(error), title=error.title, type=error.problem_type)
    retry_after = getattr(error, "retry_after", None)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


# Another user's job, seen through the view permission, is acted on with the change permission.
CHANGE_EVERY_JOB = "idempotency.change_operation"


def job_to_act_on(request, job_id) -> Operation:
    """The job, if the user sees it (404 otherwise) and may act on it (their own, or with the
    job model's change permission: 403 otherwise)."""
    operation = visible_operations(request.user).filter(op_id=job_id).first()
    if operation is None:
        raise NotFound("No such job.")
    if operation.owner_id != request.user.pk and not request.user.has_perm(CHANGE_EVERY_JOB):
        raise PermissionDenied("You may see this job, not act on it.")
    return operation


@documented
class JobCancelView(JobsView):
    """POST: cancel the job (202 with its body); an ended job, 409 problem."""

    @idempotency_key("optional")
    def post(self, request, job_id):
        operation = job_to_act_on(request, job_id)
        try:
            operation = cancel_job(operation.op_id)
        except JobServiceError as exc:
            return service_problem(exc)
        return Response(job_body(operation, request), status=status.HTTP_202_ACCEPTED)


@documented
class JobRetryView(JobsView):
    """POST (Idempotency-Key required): a new job retrying this one (201 with its body, the same
    job on a replay); a job not FAILED, TIMED_OUT or CANCELLED, 409 problem."""

    @idempotency_key("required", atomic=True)
    def post(self, request, job_id):
        operation = job_to_act_on(request, job_id)
        context = request.idempotency
        try:
            # The job's owner owns its retry too (an operator's retry shows among the user's jobs).
            new, _created = retry_job(
                operation.op_id, key=context.key, owner=operation.owner, scope=context.scope
            )
        except IdempotencyKeyMismatch as exc:
            return problem_from_error(exc)
        except JobServiceError as exc:
            return service_problem(exc)
        body = job_body(new, request)
        body["retry_of"] = str(operation.op_id)
        return Response(body, status=status.HTTP_201_CREATED)
