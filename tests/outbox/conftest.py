"""The outbox room's set-up: a Cloud Tasks emulator with its queue held, the outboxes a test
opens (closed after it), and a migrated Postgres outbox."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import open_outbox
from tests.support import postgres as postgres_support
from tests.support.outbox import QUEUE_PATH, Outboxes


@pytest.fixture
def tasks() -> Iterator[CloudTasksEmulator]:
    """An emulator whose outbox queue is PAUSED: held, never dispatched, so the tests count
    what the relay created."""
    with CloudTasksEmulator(scheduler_on_schedule=False) as emulator:
        emulator.create_queue(QUEUE_PATH, state="PAUSED")
        yield emulator


@pytest.fixture
def outboxes() -> Iterator[Outboxes]:
    opened = Outboxes()
    yield opened
    opened.close()


@pytest.fixture
def pg_url(postgres_cluster: postgres_support.Cluster) -> str:
    """The URL of a migrated outbox in a fresh schema of the session's cluster."""
    url = postgres_cluster.url(schema=postgres_support.fresh_schema())
    db = open_outbox(url)
    db.migrate()
    db.close()
    return url
