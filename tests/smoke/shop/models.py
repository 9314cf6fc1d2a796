from django.conf import settings
from django.db import models


class Order(models.Model):
    """The README's `Order` (owner, sku): one row per order its view created, so a replayed
    request must not add a second."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    sku = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
