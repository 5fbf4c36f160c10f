"""The app under a real uvicorn server on 127.0.0.1 (in a thread of the test process), its
producer enqueueing into tasklease's stub queue, which delivers back to the server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import uvicorn
from shop import app, tasks

from tasklease.testing.stubs import StubQueue


class Http:
    """The stub queue's client: posts to the server, as Cloud Tasks would."""

    def __init__(self, url: str) -> None:
        self.url = url

    def post(self, path: str, *, headers: dict[str, str], data: bytes) -> Any:
        response = requests.post(self.url + path, headers=headers, data=data, timeout=30)
        response.get_data = lambda: response.content  # type: ignore[attr-defined]
        return response


@pytest.fixture
def queue() -> Iterator[StubQueue]:
    """Tasks created by reference go here; their URLs carry the /worker mount."""
    stub = StubQueue(worker_url="http://worker.test/worker").bind(tasks.router)
    yield stub
    stub.close()


@pytest.fixture
def server(queue: StubQueue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Http]:
    monkeypatch.setenv("TASKLEASE_STORE", f"sqlite:///{tmp_path}/runs.db")
    monkeypatch.setenv("TASKLEASE_AUTH", "none")  # Local tests only: deploys verify OIDC.
    monkeypatch.setattr(tasks, "sent", [])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(app.create_app(), host="127.0.0.1", port=port, log_level="warning")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not running.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield Http(f"http://127.0.0.1:{port}")
    running.should_exit = True
    thread.join(timeout=10)
