"""Finding: a request whose body ends before its Content-Length (the sender's connection
broke mid-body) reaches the handler logic as a short body; the truncated JSON is taken for a
bad payload and the run is dead-lettered for good, so Cloud Tasks' retry with the full body
is answered "already failed permanently" and the task never runs."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path

import requests

from tasklease.plumbing.serve import GunicornWorker
from tests.support.helpers import task_headers


def _send_truncated(url: str, path: str, body: bytes, headers: dict[str, str]) -> None:
    host, port = url.removeprefix("http://").split(":")
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    head += ["Content-Type: application/json", "", ""]
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall("\r\n".join(head).encode() + body[: len(body) // 2])
        conn.shutdown(socket.SHUT_WR)  # The sender's side breaks off mid-body.
        with contextlib.suppress(OSError):
            conn.recv(65536)


def test_a_body_cut_short_by_a_broken_connection_is_not_dead_lettered(tmp_path: Path) -> None:
    server = GunicornWorker(
        "tests.support.apps:router",
        store=f"sqlite:///{tmp_path}/runs.db",
        workers=1,
        threads=2,
        env={"TEST_LEDGER": str(tmp_path / "ledger.db")},
        log_path=tmp_path / "gunicorn.log",
    )
    body = json.dumps({"n": 7, "note": "x" * 200}).encode()
    headers = task_headers(task="cut-short")
    with server:
        _send_truncated(server.url, "/tasks/record", body, headers)
        time.sleep(1)  # Let the worker finish with the broken request (it only ever helps).
        retry = requests.post(
            f"{server.url}/tasks/record",
            data=body,
            headers={**task_headers(task="cut-short", retry=1), "Content-Type": "application/json"},
            timeout=30,
        )
    answer = retry.json()
    assert "error" not in answer or "not valid JSON" not in answer["error"], answer
    assert retry.headers["X-Tasklease-Outcome"] == "processed", answer
