"""The store room's set-up: every store a test opened through closed_after_the_test is
closed after it, and a Firestore store on a collection of its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tasklease.worker.stores import FirestoreStore
from tests.support.firestore import PROJECT, unique_collection
from tests.support.stores import close_opened, closed_after_the_test


@pytest.fixture(autouse=True)
def _close_opened_stores() -> Iterator[None]:
    yield
    close_opened()


@pytest.fixture
def firestore_store(firestore_host: str | None) -> FirestoreStore:
    """A store on the session's Firestore, in a collection of its own."""
    return closed_after_the_test(
        FirestoreStore.from_options(collection=unique_collection(), project=PROJECT)
    )
