from django.urls import include, path
from rest_framework.routers import SimpleRouter

from config.urls import handler400, handler403, handler404, handler500  # noqa: F401
from config.urls import urlpatterns as project_urls

from . import views

router = SimpleRouter()
router.register("items", views.ItemViewSet, basename="item")

urlpatterns = [
    path("t/plain/", views.plain_create),
    path("t/default/", views.plain_default),
    path("t/exempt/", views.plain_exempt),
    path("t/status/<int:code>/", views.with_status),
    path("t/boom/", views.boom),
    path("t/streaming/", views.streaming),
    path("t/atomic/", views.atomic_effect),
    path("t/gated/", views.gated),
    path("t/plain-effect/", views.plain_effect),
    path("t/drf/", views.DrfCreate.as_view()),
    path("t/form-upload/", views.form_upload),
    path("t/drf-upload/", views.DrfUpload.as_view()),
    path("t/raw-stream/", views.raw_stream),
    path("t/drf-func/", views.drf_function),
    path("t/django-class/", views.PlainClassView.as_view()),
    path("t/form/", views.form_redirect),
    path("t/parse-json/", views.parse_json),
    path("t/nul/", views.nul_answer),
    path("t/nul-atomic/", views.nul_answer_atomic),
    path("t/form-atomic/", views.form_redirect_atomic),
    path("t/jobs-without-the-layer/", views.baseline_job_create),
    path("t/", include(router.urls)),
    *project_urls,
]
