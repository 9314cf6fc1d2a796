"""The jobs API: POST /api/jobs/ (Idempotency-Key required), GET /api/jobs/ (the user's jobs,
filtered, paginated), GET /api/jobs/<job_id>/ (one job with its stages). Throttled (scope
"jobs", gateway.throttling) and described by an OpenAPI schema (gateway.openapi)."""

from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from eventbus.exceptions import JobLimitReached
from eventbus.limits import check_running_cap
from eventbus.selectors import latest_event
from eventbus.stages import recorded_failure
from eventbus.tasks import enqueue
from idempotency.decorators import idempotency_key
from idempotency.exceptions import IdempotencyKeyMismatch
from idempotency.models import Operation
from idempotency.problems import problem, problem_from_error
from idempotency.services import Command, accept

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


def limit_problem(exc: JobLimitReached):
    response = problem(429, str(exc), title="Too many jobs running", type="urn:problem:job-limit-reached")
    response["Retry-After"] = str(exc.retry_after)
    return response


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
        command = Command(
            scope=context.scope,
            idem_key=context.key,
            domain=serializer.validated_data["domain"],
            event_type="job.requested",
            payload=serializer.validated_data["payload"],
            owner=request.user,
        )
        try:
            check_running_cap(request.user)
            operation, _created = accept(command, on_accepted=enqueue)
        except IdempotencyKeyMismatch as exc:
            return problem_from_error(exc)
        except JobLimitReached as exc:  # a 429: the key is not stored, free once a job ends
            return limit_problem(exc)
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
        operation.error = job_error(operation, latest)
        operation.stages = job_stages(operation.domain, stage_records(operation))
        return Response(JobDetailSerializer(operation, context={"request": request}).data)


def job_error(operation, latest: dict | None) -> dict | None:
    """Why a FAILED job failed: {"stage", "type", "message"}, from the stage's record (stage
    None: it failed outside any stage, and only its final event, while Redis keeps it, says why)."""
    if operation.state != Operation.State.FAILED:
        return None
    failure = recorded_failure(operation)
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
