"""Finding: under Django served by gunicorn, a delivery whose body came chunked (no
Content-Length: the server frames it, as gunicorn says with ``wsgi.input_terminated``) was
read as empty, because Django reads no further than Content-Length. The handler got no
payload and the run was dead-lettered ("not a Django task payload"), and every retry was
answered "already failed permanently": the task never ran. The Flask routes read it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import requests

from tasklease.django import DJANGO_TASK_HANDLER
from tasklease.plumbing.serve import free_port
from tests.django.regressions.test_django_body_cut_short_is_not_dead_lettered import (
    _wait_until_serving,
)
from tests.support.helpers import task_headers

PATH = f"/worker/tasks/{DJANGO_TASK_HANDLER}"


def test_a_chunked_delivery_under_django_runs_its_task(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "TASKLEASE_DJANGO_TMP": str(tmp_path)}
    command = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    with (tmp_path / "gunicorn.log").open("wb") as log:
        server = subprocess.Popen(
            [*command, "tests.django_project.gunicorn_app:application"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_until_serving(port, server)
        body = json.dumps({"task": "tests.django_project.tasks.record", "args": ["x"]}).encode()
        answer = requests.post(
            f"http://127.0.0.1:{port}{PATH}",
            data=iter([body]),  # A generator: requests sends it chunked.
            headers={**task_headers(task="chunked"), "Content-Type": "application/json"},
            timeout=30,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert answer.headers["X-Tasklease-Outcome"] == "processed", answer.json()
    assert answer.json()["result"] == "noted x"
