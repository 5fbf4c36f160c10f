from django.urls import include, path

from shop.views import place_order

urlpatterns = [
    path("orders", place_order),
    # The tasklease worker: POST /worker/tasks/<name>; TASKLEASE_WORKER_URL ends in /worker.
    path("worker/", include("tasklease.django.urls")),
]
