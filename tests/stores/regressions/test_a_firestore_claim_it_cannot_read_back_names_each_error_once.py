"""Finding: a Firestore claim whose write may have landed (its create timed out, or conflicted
with the client's own first try) and whose read-back failed too answered "Firestore store:
could not claim a run (...) nor read it back: Firestore store: could not read a run: 503
down": the read's error came wrapped in a second store message, which the 503 answer and the
log line then carried. The answer names the store once, then each error by itself, as
before the claim was shared with Postgres."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.api_core import exceptions as api

from tasklease.errors import StoreUnavailable
from tasklease.worker.stores import FirestoreStore
from tests.support.firestore import PROJECT, unique_collection
from tests.support.firestore_faults import Scripted
from tests.support.helpers import T0, claim_request


@pytest.fixture
def store(firestore_host: str | None) -> Iterator[FirestoreStore]:
    store = FirestoreStore.from_options(collection=unique_collection(), project=PROJECT)
    yield store
    store.close()


@pytest.mark.parametrize(
    "create_error",
    [api.DeadlineExceeded("timed out"), api.Conflict("already exists")],
    ids=["timed-out", "own-first-try"],
)
def test_the_claim_error_names_the_store_once_and_the_read_error_as_it_came(
    store: FirestoreStore, monkeypatch: pytest.MonkeyPatch, create_error: api.GoogleAPIError
) -> None:
    document = Scripted(store, monkeypatch)
    document.fail("create", create_error)
    document.fail("get", api.ServiceUnavailable("down"))
    with pytest.raises(StoreUnavailable) as refused:
        store.claim(claim_request(), T0)
    assert str(refused.value) == (
        f"Firestore store: could not claim a run ({create_error}) nor read it back: 503 down"
    )
