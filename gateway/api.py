"""The jobs API: POST /api/jobs/ (Idempotency-Key required), GET /api/jobs/<job_id>/."""

from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from eventbus.selectors import latest_event
from eventbus.stages import recorded_failure
from eventbus.tasks import enqueue
from idempotency.decorators import idempotency_key
from idempotency.exceptions import IdempotencyKeyMismatch
from idempotency.models import Operation
from idempotency.problems import problem_from_error
from idempotency.services import Command, accept

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
        command = Command(
            scope=context.scope,
            idem_key=context.key,
            domain=serializer.validated_data["domain"],
            event_type="job.requested",
            payload=serializer.validated_data["payload"],
            owner=request.user,
        )
        try:
            operation, _created = accept(command, on_accepted=enqueue)
        except IdempotencyKeyMismatch as exc:
            return problem_from_error(exc)
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
