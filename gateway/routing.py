from django.urls import re_path

from .consumers import JobStreamConsumer

# Any id reaches the consumer, so that a malformed one gets close code 4400, not a refused handshake.
websocket_urlpatterns = [re_path(r"^ws/jobs/(?P<job_id>[^/]+)/$", JobStreamConsumer.as_asgi())]
