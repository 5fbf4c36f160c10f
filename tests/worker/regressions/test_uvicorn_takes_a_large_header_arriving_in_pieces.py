"""Finding: ``tasklease[asgi]`` installs uvicorn without httptools, so uvicorn parses with
h11, whose buffer for a request's incomplete head holds 16 KiB. Cloud Tasks delivers up to
80 KB of a task's headers; a head larger than 16 KiB that arrives in more than one piece
(TCP segments, as through any proxy) was answered 400 by uvicorn itself: retried until Cloud
Tasks gave up, never run, never recorded."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tasklease.plumbing.serve import free_port


def _uvicorn_with_h11(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``python -m tasklease.worker.asgi_serve`` (the uvicorn Procfile's command) where
    httptools cannot be imported, as after ``pip install tasklease[asgi]``."""
    hidden = tmp_path / "no-httptools" / "httptools"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("not installed")\n')
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hidden.parent), os.getcwd()]),
        "TASKLEASE_ROUTER": "tests.support.apps:router",
        "TASKLEASE_STORE": f"sqlite:///{tmp_path}/runs.db",
        "TASKLEASE_AUTH": "none",
        "TEST_LEDGER": str(tmp_path / "ledger.db"),
    }
    command = [sys.executable, "-m", "tasklease.worker.asgi_serve", "--host", "127.0.0.1"]
    with (tmp_path / "server.log").open("wb") as log:
        server = subprocess.Popen(
            [*command, "--port", str(port), "--workers", "1"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    for _ in range(300):
        if server.poll() is not None:
            raise RuntimeError((tmp_path / "server.log").read_text())
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return server, port
        time.sleep(0.1)
    server.kill()
    raise RuntimeError("uvicorn did not start")


def test_a_20_kb_header_arriving_in_two_pieces_reaches_the_handler(tmp_path: Path) -> None:
    server, port = _uvicorn_with_h11(tmp_path)
    body = b'{"n": 1}'
    head = [
        "POST /tasks/record HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Content-Length: {len(body)}",
        "Content-Type: application/json",
        "X-CloudTasks-QueueName: default",
        "X-CloudTasks-TaskName: large-header",
        "X-Signed-Context: " + "c" * 20_000,
        "Connection: close",
        "",
        "",
    ]
    request = "\r\n".join(head).encode() + body
    answer = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(request[:17_000])
            time.sleep(0.5)  # The rest of the head comes in a later segment.
            conn.sendall(request[17_000:])
            while chunk := conn.recv(65536):
                answer += chunk
    finally:
        server.terminate()
        server.wait(timeout=30)
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line == b"HTTP/1.1 200 OK", answer[:300]
    assert b"x-tasklease-outcome: processed" in answer.lower()
