"""The page, and the favicon every browser asks for at /favicon.ico."""

from pathlib import Path

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_control
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_safe

from eventbus.jobtypes import FINAL_STAGE, registry

FAVICON = Path(__file__).resolve().parent / "static" / "gateway" / "favicon.ico"


@login_required
@ensure_csrf_cookie  # the page's fetch() sends the token back in X-CSRFToken
def index(request):
    return render(request, "gateway/index.html", {"job_types": job_types()})


def job_types() -> list[dict]:
    """Every registered job type as the page needs it: stages in order, then the final one."""
    return [
        {
            "name": name,
            "stages": [planned.name for planned in job_type.plan()] + [FINAL_STAGE],
            "example_payload": job_type.example_payload,
            "description": job_type.description,
            "startable": job_type.startable_by_api,
        }
        for name, job_type in registry().items()  # in registration order: the demo's first is scan
    ]


@require_safe
@cache_control(public=True, max_age=86400)
def favicon(request):
    """Served from the app's own file rather than redirected to /static/: browsers ask for
    /favicon.ico on every page, the API's and the admin's too, wherever static files are served."""
    return HttpResponse(FAVICON.read_bytes(), content_type="image/x-icon")
