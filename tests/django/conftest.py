"""The Django room's set-up: tests/django_project's WSGI application served by a real
gunicorn (one worker) on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasklease.plumbing.serve import free_port


def _wait_until_serving(port: int, server: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {server.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.1)
    raise RuntimeError("gunicorn did not start")


@pytest.fixture
def django_under_gunicorn(tmp_path: Path) -> Iterator[int]:
    """The port of a gunicorn serving tests.django_project (its files under ``tmp_path``,
    its log in ``tmp_path/gunicorn.log``), stopped after the test."""
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
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)
