from django.db import models


class Order(models.Model):
    """One row per order the view created: a replayed request must not add a second."""

    item = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
