from __future__ import annotations

import pytest
from flask.testing import FlaskClient
from myapp import mail, tasks

from tasklease import create_app
from tasklease.testing.stubs import StubQueue


@pytest.fixture
def client(tasklease_queue: StubQueue, monkeypatch: pytest.MonkeyPatch) -> FlaskClient:
    """The worker on an in-memory store, its handlers enqueueing into the stub queue."""
    monkeypatch.setattr(tasks, "producer", lambda: tasklease_queue.producer)
    monkeypatch.setattr(mail, "outbox", [])
    return create_app(tasks.router, store="memory://", auth="none").test_client()
