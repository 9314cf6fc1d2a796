"""The jobs API: POST /api/jobs/ (Idempotency-Key required), GET /api/jobs/<job_id>/,
POST /api/jobs/<job_id>/cancel/ and /retry/: thin calls of the job services (eventbus.services)."""

from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
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

from .parsers import JSONParser
from .selectors import visible_operations
from .serializers import JobRequestSerializer


def job_body(operation, request):
    scheme = "wss" if request.is_secure() else "ws"
    return {
        "job_id": str(operation.op_id),
        "domain": operation.domain,
        "state": operation.state,
        "ws_url": f"{scheme}://{request.get_host()}/ws/jobs/{operation.op_id}/",
    }


# DRF's default parsers, with a body nested too deep for Python's JSON parser a 400 (gateway.parsers).
JOB_PARSERS = [JSONParser, FormParser, MultiPartParser]


class JobListView(APIView):
    # Whatever the project's REST_FRAMEWORK defaults: jobs belong to a user.
    permission_classes = [IsAuthenticated]
    parser_classes = JOB_PARSERS

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


class JobDetailView(APIView):
    permission_classes = [IsAuthenticated]
    parser_classes = JOB_PARSERS

    def get(self, request, job_id):
        operation = visible_operations(request.user).filter(op_id=job_id).first()
        if operation is None:
            raise NotFound("No such job.")
        body = job_body(operation, request)
        latest = latest_event(operation.domain, str(operation.op_id))
        body.update(
            {
                "accepted_at": operation.accepted_at,
                "completed_at": operation.completed_at,
                "payload": operation.payload,
                "latest_event": latest,
                "error": job_error(operation, latest),
            }
        )
        return Response(body)


def job_error(operation, latest: dict | None) -> dict | None:
    """Why a FAILED job failed: {"stage", "type", "message"}, from the stage's record (stage
    None: it failed outside any stage, and only its final event, while Redis keeps it, says why)."""
    if operation.state != Operation.State.FAILED:
        return None
    failure = recorded_failure(operation)
    if failure is None and latest is not None:
        data = latest.get("data")
        if isinstance(data, dict) and data.get("final") is True and isinstance(data.get("error"), dict):
            failure = data["error"]
    return failure


def service_problem(error: JobServiceError):
    """A job service's refusal (an ended job, a job not retryable, the running cap) as its problem."""
    response = problem(error.status, str(error), title=error.title)
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


class JobCancelView(APIView):
    """POST: cancel the job (202 with its body); an ended job, 409 problem."""

    permission_classes = [IsAuthenticated]
    parser_classes = JOB_PARSERS

    @idempotency_key("optional")
    def post(self, request, job_id):
        operation = job_to_act_on(request, job_id)
        try:
            operation = cancel_job(operation.op_id)
        except JobServiceError as exc:
            return service_problem(exc)
        return Response(job_body(operation, request), status=status.HTTP_202_ACCEPTED)


class JobRetryView(APIView):
    """POST (Idempotency-Key required): a new job retrying this one (201 with its body, the same
    job on a replay); a job not FAILED, TIMED_OUT or CANCELLED, 409 problem."""

    permission_classes = [IsAuthenticated]
    parser_classes = JOB_PARSERS

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
