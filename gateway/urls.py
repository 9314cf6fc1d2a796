from django.urls import path

from . import api, views

urlpatterns = [
    path("", views.index, name="index"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("api/jobs/", api.JobListView.as_view(), name="job-list"),
    path("api/jobs/<uuid:job_id>/", api.JobDetailView.as_view(), name="job-detail"),
]
