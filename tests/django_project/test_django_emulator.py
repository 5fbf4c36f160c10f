"""End to end on real HTTP: a Django task enqueued through the backend into the local Cloud
Tasks emulator, which delivers it (twice at once, a fault it injects) with a signed OIDC
token to the Django project served by a real WSGI server; the task runs once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.test import override_settings

from tasklease.django import compat
from tasklease.emulator import CloudTasksEmulator
from tasklease.emulator.faults import Faults
from tasklease.emulator.http_server import HttpServer
from tasklease.producer import Producer
from tasklease.worker.auth.authenticators import OidcAuth
from tests.django_project import tasks

ACCOUNT = "tasks@p.iam.gserviceaccount.com"


@pytest.fixture
def django_server() -> Iterator[str]:
    """The test project's WSGI app on 127.0.0.1: its worker's URL."""
    server = HttpServer(WSGIHandler(), "127.0.0.1", 0)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}/worker"
    finally:
        server.stop()


def test_the_emulator_delivers_a_django_task_with_oidc_and_it_runs_once(
    django_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks.CALLS.clear()
    with CloudTasksEmulator(faults=Faults(duplicate=1.0, seed=7)) as emulator:
        emulator.create_queue("projects/p/locations/us-central1/queues/default")
        producer = Producer(
            "p", "us-central1", worker_url=django_server, service_account=ACCOUNT,
            tasks_endpoint=emulator.url,
        )  # fmt: skip
        monkeypatch.setattr(compat.tasks.task_backends["default"], "producer", producer)
        auth = OidcAuth([ACCOUNT], audience=django_server, certs_url=emulator.certs_url)
        with override_settings(TASKLEASE_AUTH=auth, ALLOWED_HOSTS=["127.0.0.1"]):
            tasks.record.enqueue("emulated")
            emulator.join(timeout=60)
            deliveries = emulator.deliveries()
        producer.close()
    assert tasks.CALLS == ["emulated"]
    outcomes = sorted(d.outcome or f"status {d.status}" for d in deliveries)
    assert "processed" in outcomes
    assert len(deliveries) >= 2  # The injected twin reached the worker too.
    assert set(outcomes) <= {"processed", "duplicate", "in_progress"}
