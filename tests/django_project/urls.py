"""The test project's URLconf: the worker included under /worker/."""

from django.urls import include, path

urlpatterns = [path("worker/", include("tasklease.django.urls"))]
