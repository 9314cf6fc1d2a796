from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from idempotency.problems import (
    problem_handler400,
    problem_handler403,
    problem_handler404,
    problem_handler500,
)

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("metrics", views.metrics, name="metrics"),
    path("idempotency/", include("idempotency.urls")),
    # The demo's django.tasks task, enqueued under the request's Idempotency-Key (config.views).
    path("demo/tasks/", views.DemoTasksView.as_view(), name="demo-tasks"),
    # The jobs API's OpenAPI 3 schema (gateway.openapi); YAML, or JSON with ?format=json.
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("", include("gateway.urls")),
]

handler400 = problem_handler400
handler403 = problem_handler403
handler404 = problem_handler404
handler500 = problem_handler500
