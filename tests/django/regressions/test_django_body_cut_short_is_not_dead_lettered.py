"""Finding: under Django (``tasklease.django.urls``), a request whose body ends before its
Content-Length (the sender's connection broke mid-body) reached the executor as a short
body; the cut JSON was taken for a bad payload and the run dead-lettered for good, so
Cloud Tasks' retry with the whole body was answered "already failed permanently" and the
task never ran. The Flask and ASGI workers refuse such a body (400, nothing claimed)."""

from __future__ import annotations

import contextlib
import json
import socket

import requests

from tasklease.django import DJANGO_TASK_HANDLER
from tests.support.helpers import task_headers

PATH = f"/worker/tasks/{DJANGO_TASK_HANDLER}"


def _send_truncated(port: int, body: bytes, headers: dict[str, str]) -> bytes:
    head = [f"POST {PATH} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    head += ["Content-Type: application/json", "", ""]
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall("\r\n".join(head).encode() + body[: len(body) // 2])
        conn.shutdown(socket.SHUT_WR)  # The sender's side breaks off mid-body.
        with contextlib.suppress(OSError):
            answer = conn.recv(65536)
    return answer


def test_a_body_cut_short_under_django_is_refused_and_its_retry_runs(
    django_under_gunicorn: int,
) -> None:
    port = django_under_gunicorn
    body = json.dumps({"task": "tests.django_project.tasks.record", "args": ["x" * 200]}).encode()
    _send_truncated(port, body, task_headers(task="cut-short"))
    retry = requests.post(
        f"http://127.0.0.1:{port}{PATH}",
        data=body,
        headers={**task_headers(task="cut-short", retry=1), "Content-Type": "application/json"},
        timeout=30,
    )
    assert retry.headers["X-Tasklease-Outcome"] == "processed", retry.json()
