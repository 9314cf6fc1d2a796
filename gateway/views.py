from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie


@login_required
@ensure_csrf_cookie  # the page's fetch() sends the token back in X-CSRFToken
def index(request):
    return render(request, "index.html")
