from django.urls import path

from . import api, views

urlpatterns = [
    path("", views.index, name="index"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("api/jobs/", api.JobListView.as_view(), name="job-list"),
    path("api/jobs/<uuid:job_id>/", api.JobDetailView.as_view(), name="job-detail"),
    path("api/jobs/<uuid:job_id>/cancel/", api.JobCancelView.as_view(), name="job-cancel"),
    path("api/jobs/<uuid:job_id>/retry/", api.JobRetryView.as_view(), name="job-retry"),
    path("api/jobs/<uuid:job_id>/signals/<str:name>/", api.JobSignalView.as_view(), name="job-signal"),
]
