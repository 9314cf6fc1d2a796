from django.urls import path

from config.urls import urlpatterns as project_urls

from . import views

urlpatterns = [
    path("t/enqueue-two/", views.EnqueueTwo.as_view()),
    *project_urls,
]
