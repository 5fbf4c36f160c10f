"""The shop under Django's test client: its database and the worker's run store in a
temporary folder, the backend's producer a stub queue the relay sends the outbox into."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_TMP = Path(tempfile.mkdtemp(prefix="django-shop-"))
DATABASE = _TMP / "shop.db"
os.environ.update(
    DJANGO_SETTINGS_MODULE="shop.settings",
    SHOP_DATABASE=str(DATABASE),
    TASKLEASE_PROJECT="shop-project",
    TASKLEASE_LOCATION="europe-west1",
    TASKLEASE_WORKER_URL="http://testserver/worker",
    TASKLEASE_STORE=f"sqlite:///{_TMP / 'runs.db'}",
    TASKLEASE_AUTH="none",  # Local tests only: deploys verify OIDC.
)

import django  # noqa: E402 - after the settings' environment.

django.setup()

from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402

from tasklease.django import CloudTasksBackend  # noqa: E402
from tasklease.outbox import Relay, open_outbox  # noqa: E402
from tasklease.testing.stubs import StubQueue  # noqa: E402

call_command("migrate", verbosity=0)


class Worker:
    """The stub queue's client: Django's test client posting as Cloud Tasks would."""

    def __init__(self) -> None:
        self.client = Client()

    def post(self, path: str, *, headers: dict[str, str], data: bytes) -> Any:
        headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        response = self.client.post(
            path, data=data, content_type="application/json", headers=headers
        )
        response.get_data = lambda: response.content
        return response


@pytest.fixture
def queue() -> Iterator[StubQueue]:
    """The Cloud Tasks queue the backend (and the relay) create tasks in."""
    from shop import tasks  # noqa: PLC0415 - after django.setup().

    try:
        from django.tasks import task_backends  # noqa: PLC0415
    except ImportError:  # Python 3.11: the backport
        from django_tasks import task_backends  # noqa: PLC0415
    stub = StubQueue(worker_url="http://testserver/worker")
    backend = task_backends["default"]
    assert isinstance(backend, CloudTasksBackend)
    previous = backend.producer
    backend.producer = stub.producer
    tasks.sent.clear()
    yield stub
    backend.producer = previous
    stub.close()


def relay(queue: StubQueue) -> int:
    """Send what the outbox holds (in production: `tasklease outbox relay --follow`)."""
    db = open_outbox(f"sqlite:///{DATABASE}")
    try:
        return Relay(db, queue.producer).drain().sent
    finally:
        db.close()


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_TMP, ignore_errors=True)
