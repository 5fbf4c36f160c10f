"""The worker's URLs: ``path("worker/", include("tasklease.django.urls"))`` serves
``worker/tasks/<name>`` and ``worker/jobs/<name>``; the producer's ``worker_url`` is then
``https://HOST/worker``."""

from __future__ import annotations

from django.urls import path

from tasklease.django import views

app_name = "tasklease"
urlpatterns = [
    path("tasks/<str:name>", views.task, name="task"),
    path("jobs/<str:name>", views.job, name="job"),
]
