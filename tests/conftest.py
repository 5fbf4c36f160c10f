from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from pytest_httpserver import HTTPServer

from emulator import CloudTasksEmulator
from tests.emulator_target import Target
from tests.fake_cloud_tasks import FakeCloudTasks
from tests.helpers import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def _tasklease_logs_propagate() -> Iterator[None]:
    """Let caplog see tasklease's records even if a test configured JSON logging."""
    logger = logging.getLogger("tasklease")
    saved = (logger.propagate, list(logger.handlers))
    logger.propagate = True
    yield
    logger.propagate, logger.handlers[:] = saved[0], saved[1]


@pytest.fixture(scope="session")
def _cloud_tasks_server() -> Iterator[HTTPServer]:
    # One server for the session: stopping werkzeug's server takes half a second.
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def cloud_tasks(_cloud_tasks_server: HTTPServer) -> Iterator[FakeCloudTasks]:
    _cloud_tasks_server.clear()
    yield FakeCloudTasks(_cloud_tasks_server)
    _cloud_tasks_server.clear()


@pytest.fixture(scope="session")
def _target_server() -> Iterator[HTTPServer]:
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def target(_target_server: HTTPServer) -> Iterator[tuple[Target, str]]:
    """A recording HTTP target; yields it and its URL."""
    recorder = Target()
    _target_server.clear()
    _target_server.expect_request("/tasks/hit").respond_with_handler(recorder)
    yield recorder, _target_server.url_for("/tasks/hit")
    _target_server.clear()


@pytest.fixture
def emulator() -> Iterator[CloudTasksEmulator]:
    with CloudTasksEmulator() as running:
        yield running
