"""The worker room's set-up: a Spanner store beside an ``effects`` table for the handlers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tasklease.worker.stores import SpannerStore
from tests.support.spanner_effects import store_with_effects


@pytest.fixture
def spanner_effects_store(spanner_database: str) -> Iterator[SpannerStore]:
    """A store on a fresh emulator database with an ``effects`` table; closed after the test."""
    store = store_with_effects(spanner_database)
    yield store
    store.close()
