from django.urls import path

from . import views

urlpatterns = [
    path("pay", views.pay),
    path("products", views.products),
]
