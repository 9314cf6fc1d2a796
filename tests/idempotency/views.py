"""Views of every kind the idempotency layer must cover, for tests/idempotency."""

import json
import threading
import uuid
from collections import Counter

from django import forms
from django.core.exceptions import BadRequest
from django.db import transaction
from django.http import HttpResponse, HttpResponseRedirect, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from rest_framework import viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action, api_view
from rest_framework.response import Response
from rest_framework.views import APIView

from eventbus.models import Job
from exactly_once.jsontext import nested_deeper_than
from idempotency.decorators import idempotency_key
from tests.postgres import kill_own_backend

CALLS: Counter[str] = Counter()
_lock = threading.Lock()
# Set by tests that need a view to block until they let it go. One-shot: the first
# request that asks for a gate takes it; later ones run straight through.
GATES: dict[str, threading.Event] = {}
# Likewise one-shot: the first request with ?kill=<name> for a name in here loses its backend.
KILLS: set[str] = set()


def wait_at_gate(request):
    gate = GATES.pop(request.GET.get("gate", ""), None)
    if gate is not None:
        gate.wait(10)


def executed(name: str) -> int:
    with _lock:
        CALLS[name] += 1
        return CALLS[name]


@idempotency_key("required")
@csrf_exempt
def plain_create(request):
    n = executed("plain")
    response = JsonResponse({"n": n, "body": request.body.decode("utf-8", "replace")}, status=201)
    response["ETag"] = f'"v{n}"'
    response["Location"] = f"/things/{n}/"
    response["X-Internal"] = "not replayed"
    response.set_cookie("session-ish", "secret")
    return response


@csrf_exempt
def plain_default(request):
    """No marker: the DEFAULT_POLICY (optional) applies."""
    return JsonResponse({"n": executed("default")}, status=201)


@idempotency_key("exempt")
@csrf_exempt
def plain_exempt(request):
    return JsonResponse({"n": executed("exempt")}, status=201)


@idempotency_key("required")
@csrf_exempt
def with_status(request, code):
    n = executed(f"status-{code}")
    return JsonResponse({"n": n, "status": code}, status=code)


@idempotency_key("required")
@csrf_exempt
def boom(request):
    executed("boom")
    raise RuntimeError("view failed")


@idempotency_key("required")
@csrf_exempt
def streaming(request):
    executed("streaming")
    return StreamingHttpResponse(iter([b"a", b"b"]), status=201)


@idempotency_key("required", atomic=True, lease_seconds=1)
@csrf_exempt
def atomic_effect(request):
    """Creates a Job (an effect in the DB), then fails on ?fail=1 or blocks on a gate."""
    Job.objects.create(scope="test", idem_key=uuid.uuid4().hex, domain="scan", event_type="effect")
    n = executed("atomic")
    wait_at_gate(request)
    if request.GET.get("kill") in KILLS:
        KILLS.discard(request.GET["kill"])
        kill_own_backend()
        Job.objects.count()  # the connection is gone: OperationalError
    if request.GET.get("fail"):
        raise RuntimeError("fails after its effect")
    if request.GET.get("status"):
        return JsonResponse({"n": n}, status=int(request.GET["status"]))
    return JsonResponse({"n": n}, status=201)


@idempotency_key("required")
@csrf_exempt
def plain_effect(request):
    """Not marked atomic: only ATOMIC_REQUESTS puts it in a transaction."""
    Job.objects.create(scope="test", idem_key=uuid.uuid4().hex, domain="scan", event_type="effect")
    return JsonResponse({"n": executed("plain-effect")}, status=201)


@idempotency_key("required", lease_seconds=1)
@csrf_exempt
def gated(request):
    """Non-atomic: blocks on a gate, so a test can let its lease expire mid-view."""
    n = executed("gated")
    wait_at_gate(request)
    return JsonResponse({"n": n}, status=201)


class DrfCreate(APIView):
    @idempotency_key("required")
    def post(self, request):
        return Response({"n": executed("drf-class"), "data": request.data}, status=201)


@idempotency_key("required")
@api_view(["POST"])
def drf_function(request):
    return Response({"n": executed("drf-func"), "data": request.data}, status=201)


class ItemViewSet(viewsets.ViewSet):
    @idempotency_key("required")
    def create(self, request):
        return Response({"n": executed("viewset-create")}, status=201)

    @action(detail=False, methods=["post"])
    @idempotency_key("required")
    def special(self, request):
        return Response({"n": executed("viewset-special")}, status=201)

    @action(detail=False, methods=["post"])
    def unmarked(self, request):
        return Response({"n": executed("viewset-unmarked")}, status=201)


@method_decorator(csrf_exempt, name="dispatch")
@idempotency_key("required")
class PlainClassView(View):
    def post(self, request):
        return JsonResponse({"n": executed("django-class")}, status=201)

    def patch(self, request):
        return JsonResponse({"n": executed("django-class-patch")}, status=200)

    def put(self, request):
        return JsonResponse({"n": executed("django-class-put")}, status=200)


def upload_summary(request, counter):
    """What a form upload carried: its fields and each file's name and size."""
    files = {name: [(f.name, f.size) for f in request.FILES.getlist(name)] for name in request.FILES}
    return {"n": executed(counter), "fields": request.POST.dict(), "files": files}


@idempotency_key("required")
def form_upload(request):
    """A plain Django view behind the CSRF check (not exempt): a session-authenticated form."""
    return JsonResponse(upload_summary(request, "form-upload"), status=201)


class DrfUpload(APIView):
    """Session authentication, so DRF enforces CSRF (X-CSRFToken) and parses the body early."""

    authentication_classes = [SessionAuthentication]

    @idempotency_key("optional")
    def post(self, request):
        files = {name: [f.size for f in request.FILES.getlist(name)] for name in request.FILES}
        return Response(
            {"n": executed("drf-upload"), "data": request.POST.dict(), "files": files}, status=201
        )


@idempotency_key("required")
@csrf_exempt
def raw_stream(request):
    """Reads its body as a stream, in chunks, as a view taking large uploads does."""
    size = 0
    while chunk := request.read(65536):
        size += len(chunk)
    return JsonResponse({"n": executed("raw-stream"), "size": size}, status=201)


class NoteForm(forms.Form):
    title = forms.CharField(max_length=100)


def save_note(request):
    """A plain Django form, POST-redirect-GET: its effect is a row, its answer a 302 (with a
    cookie, as the messages framework would set, that a replay must not restore)."""
    form = NoteForm(request.POST)
    if not form.is_valid():
        return HttpResponse(status=400)
    note = Job.objects.create(
        scope="notes", idem_key=uuid.uuid4().hex, domain="scan", event_type="note", payload=form.cleaned_data
    )
    executed("note")
    response = HttpResponseRedirect(f"/notes/{note.pk}/")
    response.set_cookie("flash", "saved")
    return response


form_redirect = idempotency_key("required")(save_note)


@idempotency_key("required", atomic=True)
def form_redirect_atomic(request):
    return save_note(request)


@idempotency_key("required")
@csrf_exempt
def parse_json(request):
    """Parses its JSON body as a careful view does: a body it cannot parse (not JSON, nested
    too deep) is the client's error, a 400 (Django's handler answers BadRequest with one)."""
    try:
        data = json.loads(request.body)
    except (ValueError, RecursionError):
        raise BadRequest("The body is not JSON this view can read.") from None
    if nested_deeper_than(data, request.body.decode()):  # Python 3.12+ parses 5,000 levels
        raise BadRequest("The body is nested too deep for this view.")
    return JsonResponse({"n": executed("parse-json"), "keys": sorted(data)}, status=201)


def answer_with_nul(request):
    """An answer with NUL characters in its body (raw and as a JSON escape) and in a header."""
    n = executed("nul")
    body = b"raw\x00nul " + json.dumps({"text": "a\x00b", "n": n}).encode()
    response = HttpResponse(body, status=201, content_type="application/octet-stream")
    response["ETag"] = '"v\x00' + str(n) + '"'
    return response


@idempotency_key("required")
@csrf_exempt
def nul_answer(request):
    return answer_with_nul(request)


@idempotency_key("required", atomic=True)
@csrf_exempt
def nul_answer_atomic(request):
    return answer_with_nul(request)


def _job_create_without_the_layer(view, request):
    """The jobs API's create, as it runs under our middleware (atomic=True), with the context
    the middleware would hand it made here instead (no lock, no record, no replay cache)."""
    from gateway.api import JobListView
    from idempotency.execution import IdempotencyContext
    from idempotency.keys import IdemKey

    key = IdemKey.parse(request.headers["Idempotency-Key"])
    request.idempotency = IdempotencyContext(f"-:{request.user.pk}", key, None, False)
    with transaction.atomic():  # atomic, as the marker makes it under the layer
        return JobListView.post(view, request)


def _baseline_job_view():
    from gateway.api import JobListView

    @idempotency_key("exempt")
    class BaselineJobView(JobListView):
        def post(self, request):
            return _job_create_without_the_layer(self, request)

    return BaselineJobView.as_view()


baseline_job_create = _baseline_job_view()
