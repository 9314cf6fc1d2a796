"""A view that enqueues tasks under the request's Idempotency-Key, for tests/tasks/test_enqueue.py."""

from collections import Counter

from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency.decorators import idempotency_key
from tests.tasks import tasks

CALLS: Counter[str] = Counter()  # how many times each view ran (a replay runs none)


class EnqueueTwo(APIView):
    """POST: two tasks, keyed by the request's key (the idempotency middleware), the user's."""

    permission_classes = [IsAuthenticated]

    @idempotency_key("required")
    def post(self, request):
        CALLS["enqueue-two"] += 1
        first = tasks.add.enqueue(1, 2)
        second = tasks.append_line.enqueue("/dev/null", "second")
        return Response({"tasks": [first.id, second.id]}, status=201)
