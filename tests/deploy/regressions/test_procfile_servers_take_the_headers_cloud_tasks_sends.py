"""Finding: Cloud Tasks delivers a task's own headers up to 80 KB in all
(docs/platform-facts.md), but the deploy kit's gunicorn Procfile kept gunicorn's default
limit of 8190 bytes per header field. A task with a 20 KB header (a signed context a
producer attaches, say) was refused by gunicorn (400) before tasklease saw it: retried until
Cloud Tasks gave up, never run, never recorded, never a tasklease log line. (The uvicorn
Procfile takes it.)"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tasklease.deploy.source import PROCFILE, UVICORN_PROCFILE
from tasklease.plumbing.serve import free_port
from tests.support.helpers import task_headers


def _serve(procfile: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The Procfile's ``web:`` command as Cloud Run runs it, bound to loopback."""
    port = free_port()
    command = procfile.removeprefix("web: ").strip().replace("--bind :$PORT", "--bind $HOST:$PORT")
    if "asgi_serve" in command:
        command += " --host $HOST"
    env = {
        **os.environ,
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "WEB_CONCURRENCY": "1",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "TASKLEASE_ROUTER": "tests.support.apps:router",
        "TASKLEASE_STORE": f"sqlite:///{tmp_path}/runs.db",
        "TASKLEASE_AUTH": "none",
        "TEST_LEDGER": str(tmp_path / "ledger.db"),
        "PYTHONPATH": os.getcwd(),
    }
    command = command.replace("python -m", f"{sys.executable} -m")
    with (tmp_path / "server.log").open("wb") as log:
        server = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    for _ in range(300):
        if server.poll() is not None:
            raise RuntimeError(f"the server exited: {(tmp_path / 'server.log').read_text()}")
        with contextlib.suppress(OSError):
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                return server, port
        time.sleep(0.1)
    server.kill()
    raise RuntimeError("the server did not start")


@pytest.mark.parametrize("procfile", [PROCFILE, UVICORN_PROCFILE], ids=["gunicorn", "uvicorn"])
def test_a_task_with_a_20_kb_header_reaches_its_handler(procfile: str, tmp_path: Path) -> None:
    server, port = _serve(procfile, tmp_path)
    try:
        answer = requests.post(
            f"http://127.0.0.1:{port}/tasks/record",
            data=b'{"n": 1}',
            headers={
                **task_headers(task="large-header"),
                "Content-Type": "application/json",
                "X-Signed-Context": "c" * 20_000,
            },
            timeout=30,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert answer.headers.get("X-Tasklease-Outcome") == "processed", answer.text[:200]
