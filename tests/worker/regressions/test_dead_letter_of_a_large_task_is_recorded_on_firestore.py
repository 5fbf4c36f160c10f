"""Finding: a dead letter keeps the task's body as its payload, and a body up to 1 MiB (what
Cloud Tasks may deliver) does not fit, with the rest of the run, in one Firestore document
(1 MiB). The failure's write was refused, answered 503: the run was never recorded as
failed, and every retry ran the handler again until Cloud Tasks gave up."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tasklease.errors import PermanentFailure
from tasklease.worker.core import decisions
from tasklease.worker.core.records import RunStatus
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.firestore.store import FirestoreStore
from tests.support.firestore import PROJECT, unique_collection
from tests.support.helpers import T0, claim_request, task_headers


@pytest.fixture
def store(firestore_host: str | None) -> Iterator[FirestoreStore]:
    store = FirestoreStore.from_options(collection=unique_collection(), project=PROJECT)
    yield store
    store.close()


def test_a_task_of_almost_a_mebibyte_that_fails_for_good_is_recorded_once(
    store: FirestoreStore,
) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("import_batch")
    def import_batch(payload: Any, ctx: TaskContext) -> None:
        calls.append(1)
        raise PermanentFailure("the batch names an unknown account")

    client = create_app(router, store=store, auth="none").test_client()
    body = json.dumps({"rows": "x" * (1024 * 1024 - 100)})
    first = client.post("/tasks/import_batch", headers=task_headers(), data=body)
    assert first.headers["X-Tasklease-Outcome"] == "failed", first.get_json()
    retry = client.post("/tasks/import_batch", headers=task_headers(retry=1), data=body)
    assert retry.headers["X-Tasklease-Outcome"] == "duplicate", retry.get_json()
    record = store.get(first.headers["X-Tasklease-Run-Id"])
    assert record is not None and record.status is RunStatus.FAILED
    assert record.error is not None and "unknown account" in record.error
    assert record.error is not None and "payload" in record.error  # Says it was not kept.
    assert calls == [1]


def test_a_payload_that_fits_is_kept_and_one_that_does_not_is_named_in_the_error() -> None:
    claimed = decisions.claim(None, claim_request(), T0).record
    small = decisions.failed(claimed, "boom", '{"a": 1}', T0, room=1_048_576)
    assert small.payload == '{"a": 1}' and small.error == "boom"
    big = decisions.failed(claimed, "e" * 10_000, "x" * 1_048_000, T0, room=1_048_576)
    assert big.payload is None
    assert big.error is not None and big.error.endswith("was not kept: the record holds 1048576]")
    unlimited = decisions.failed(claimed, "boom", "x" * 1_048_000, T0)
    assert unlimited.payload is not None
