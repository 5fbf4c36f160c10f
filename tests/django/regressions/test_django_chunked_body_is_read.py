"""Finding: under Django served by gunicorn, a delivery whose body came chunked (no
Content-Length: the server frames it, as gunicorn says with ``wsgi.input_terminated``) was
read as empty, because Django reads no further than Content-Length. The handler got no
payload and the run was dead-lettered ("not a Django task payload"), and every retry was
answered "already failed permanently": the task never ran. The Flask routes read it."""

from __future__ import annotations

import json

import requests

from tasklease.django import DJANGO_TASK_HANDLER
from tests.support.helpers import task_headers

PATH = f"/worker/tasks/{DJANGO_TASK_HANDLER}"


def test_a_chunked_delivery_under_django_runs_its_task(django_under_gunicorn: int) -> None:
    port = django_under_gunicorn
    body = json.dumps({"task": "tests.django_project.tasks.record", "args": ["x"]}).encode()
    answer = requests.post(
        f"http://127.0.0.1:{port}{PATH}",
        data=iter([body]),  # A generator: requests sends it chunked.
        headers={**task_headers(task="chunked"), "Content-Type": "application/json"},
        timeout=30,
    )
    assert answer.headers["X-Tasklease-Outcome"] == "processed", answer.json()
    assert answer.json()["result"] == "noted x"
