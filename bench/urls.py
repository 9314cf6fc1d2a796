"""URLs of the idempotency benchmark: the jobs create under each idempotency layer, the
typical create view the targets name (a serializer, two reads: the key's job and the owner's
running jobs, one insert, the Celery task enqueued on commit). Every variant runs
gateway.api.JobListView.post itself:

    /api/jobs/            ours: @idempotency_key("required", atomic=True), the project's URL
    /bench/baseline/      no idempotency layer (exempt for ours; the view gets its scope and
                          key from the header as ours would give them), in a transaction as
                          ours runs it (atomic=True)
    /bench/drf-idem/      drf-idempotency's middleware (confined to this URL, see below)
    /bench/dik/           django-idempotency-key's @idempotency_key on the same view

and a trivial view (no database work: 201 and a small JSON body), whose ratio shows what the
layer costs a view that does nothing:

    /bench/trivial/           ours, atomic=True
    /bench/trivial-baseline/  the same view without the layer, in a transaction
"""

import drf_idempotency.settings as _drf_idempotency_settings
from django.db import transaction
from django.urls import include, path
from drf_idempotency.middleware import IdempotencyMiddleware as DrfIdempotencyMiddleware
from idempotency_key.decorators import idempotency_key as dik_idempotency_key
from rest_framework.response import Response
from rest_framework.views import APIView

from gateway.api import JobListView
from idempotency.decorators import idempotency_key
from idempotency.execution import IdempotencyContext
from idempotency.keys import IdemKey

# drf-idempotency and this project both read a setting named IDEMPOTENCY, each refusing the
# other's keys: in one project, drf-idempotency has to read another name.
# (setattr: the package declares the name Final, which mypy would refuse once it is installed.)
setattr(_drf_idempotency_settings, "USER_SETTINGS_NAME", "DRF_IDEMPOTENCY")  # noqa: B010


def _context(request):
    """What our middleware hands the view (scope of the user, parsed key), made without it."""
    key = IdemKey.parse(request.headers["Idempotency-Key"])
    return IdempotencyContext(f"-:{request.user.pk}", key, None, False)


def _job_create(view, request):
    request.idempotency = _context(request)
    return JobListView.post(view, request)


@idempotency_key("exempt")
class BaselineJobView(JobListView):
    def post(self, request):
        with transaction.atomic():
            return _job_create(self, request)


@idempotency_key("required", atomic=True)
class TrivialView(APIView):
    """Authenticated as the jobs API is (DRF), and nothing else."""

    def post(self, request):
        return Response({"accepted": True}, status=201)


@idempotency_key("exempt")
class TrivialBaselineView(TrivialView):
    def post(self, request):
        with transaction.atomic():
            return super().post(request)


class DrfIdempotencyOnItsUrl(DrfIdempotencyMiddleware):
    """drf-idempotency's middleware, for its URL only.

    Its per-view `@idempotent()` cannot wrap a DRF handler that returns a `Response`: it
    renders the response before DRF has chosen a renderer (AssertionError ".accepted_renderer
    not set on Response", drf-idempotency 1.0.0). Its middleware, the README's quick start,
    applies to every POST carrying an Idempotency-Key, so here it skips the other URLs.
    """

    def __call__(self, request):
        if not request.path.startswith(DRF_IDEMPOTENCY_PREFIX):
            return self.get_response(request)
        return super().__call__(request)


DRF_IDEMPOTENCY_PREFIX = "/bench/drf-idem/"


@idempotency_key("exempt")
class DrfIdempotencyJobView(JobListView):
    def post(self, request):
        return _job_create(self, request)


@idempotency_key("exempt")
class DikJobView(JobListView):
    def post(self, request):
        return _job_create(self, request)


urlpatterns = [
    path("bench/baseline/", BaselineJobView.as_view()),
    path("bench/trivial/", TrivialView.as_view()),
    path("bench/trivial-baseline/", TrivialBaselineView.as_view()),
    path(DRF_IDEMPOTENCY_PREFIX[1:], DrfIdempotencyJobView.as_view()),
    # The package marks the view function Django resolves (its README: decorate the view).
    path("bench/dik/", dik_idempotency_key(DikJobView.as_view())),
    path("", include("config.urls")),
]

handler404 = "idempotency.problems.problem_handler404"
handler500 = "idempotency.problems.problem_handler500"
