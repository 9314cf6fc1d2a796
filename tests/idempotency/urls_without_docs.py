"""A project that did not include idempotency.urls."""

from django.urls import path

from . import views

urlpatterns = [path("t/plain/", views.plain_create)]
