"""A project's own DRF view under the toolkit's idempotency: the marker goes above @api_view."""

from rest_framework.decorators import api_view
from rest_framework.response import Response

from idempotency.decorators import idempotency_key

from .models import Order


@idempotency_key("required")
@api_view(["POST"])
def create_order(request):
    order = Order.objects.create(item=str(request.data.get("item", "")))
    return Response({"id": order.pk, "item": order.item}, status=201)
