from django.urls import path

from .views import OrderCreate  # views.py is the README's "A view of your own", as written there

urlpatterns = [path("orders/", OrderCreate.as_view(), name="create-order")]
