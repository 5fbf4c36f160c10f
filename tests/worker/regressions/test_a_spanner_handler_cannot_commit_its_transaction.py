"""On Spanner ``ctx.transaction`` is the client's ``Transaction``, whose ``commit()`` and
``rollback()`` are public. A handler that commits it (the habit of ``session.transaction()``
code) committed its writes without the run's record: the framework's completion then met a
committed transaction, the run was given back, and the retry applied the writes again. As on
SQLite and Postgres, ending the transaction is the framework's: both are refused, the handler
raised, nothing it wrote is kept."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from google.cloud.spanner_v1 import param_types

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores import SpannerStore
from tests.support.helpers import task_headers
from tests.support.spanner_effects import effects

pytestmark = pytest.mark.service


@pytest.mark.parametrize(
    "end", [lambda tx: tx.commit(), lambda tx: tx.rollback()], ids=["commit", "rollback"]
)
def test_a_spanner_handler_that_ends_its_transaction_keeps_its_writes_once_at_most(
    spanner_effects_store: SpannerStore, end: Callable[[Any], None]
) -> None:
    store = spanner_effects_store
    router = Router()

    @router.task("charge", transactional=True)
    def charge(payload: Any, ctx: TaskContext) -> None:
        ctx.transaction.execute_update(
            "INSERT INTO effects (id, key) VALUES (@id, 'charged')",
            params={"id": str(uuid.uuid4())},
            param_types={"id": param_types.STRING},
        )
        if ctx.attempt == 1:
            end(ctx.transaction)

    client = create_app(router, store=store, auth="none").test_client()
    first = client.post("/tasks/charge", headers=task_headers(), data=b"{}")
    (record,) = store.list_runs()
    retry = client.post("/tasks/charge", headers=task_headers(retry=1, execution=1), data=b"{}")
    assert (first.headers["X-Tasklease-Outcome"], "refuses" in (record.error or "")) == (
        "released",
        True,
    )
    assert (retry.headers["X-Tasklease-Outcome"], effects(store)) == ("processed", 1)
