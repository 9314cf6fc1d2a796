"""The page, and the favicon every browser asks for at /favicon.ico."""

from pathlib import Path

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_control
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_safe

FAVICON = Path(__file__).resolve().parent / "static" / "gateway" / "favicon.ico"


@login_required
@ensure_csrf_cookie  # the page's fetch() sends the token back in X-CSRFToken
def index(request):
    return render(request, "gateway/index.html")


@require_safe
@cache_control(public=True, max_age=86400)
def favicon(request):
    """Served from the app's own file rather than redirected to /static/: browsers ask for
    /favicon.ico on every page, the API's and the admin's too, wherever static files are served."""
    return HttpResponse(FAVICON.read_bytes(), content_type="image/x-icon")
