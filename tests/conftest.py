from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

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
