"""URLs of the idempotency app: the documentation of its problem types."""

from django.urls import path

from .problems import DOCS_URL_NAME
from .views import problem_documentation

urlpatterns = [
    path("problems/<slug:slug>/", problem_documentation, name=DOCS_URL_NAME),
]
