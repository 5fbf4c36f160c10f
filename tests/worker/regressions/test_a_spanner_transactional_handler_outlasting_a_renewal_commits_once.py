"""A transactional handler on Spanner that runs past a third of its lease sees the lease
keeper renew the run while its transaction is open. The transaction read (and locked) the
run's row first, so each renewal aborted it; Spanner's client ran the handler again, up to 8
times, and the delivery answered 503, on every redelivery. The handler must run once, its
writes and the completion committed together, the lease renewed meanwhile."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from google.cloud.spanner_v1 import param_types

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.stores import SpannerStore
from tests.support.helpers import task_headers
from tests.support.spanner_effects import effects

pytestmark = pytest.mark.service

LEASE = timedelta(seconds=3)


def test_a_spanner_transactional_handler_outlasting_a_renewal_commits_once(
    spanner_effects_store: SpannerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = spanner_effects_store
    router = Router()
    calls: list[int] = []
    renewals: list[RunRecord | None] = []
    renew = store.renew_run

    def counted_renew(*args: Any, **kwargs: Any) -> RunRecord | None:
        renewals.append(renew(*args, **kwargs))
        return renewals[-1]

    monkeypatch.setattr(store, "renew_run", counted_renew)

    @router.task("settle", transactional=True, lease=LEASE)
    def settle(payload: Any, ctx: TaskContext) -> None:
        calls.append(ctx.attempt)
        ctx.transaction.execute_update(
            "INSERT INTO effects (id, key) VALUES (@id, 'settled')",
            params={"id": str(uuid.uuid4())},
            param_types={"id": param_types.STRING},
        )
        # Two renewals fall inside the open transaction (every lease / 3).
        time.sleep(LEASE.total_seconds() * 0.8)

    client = create_app(router, store=store, auth="none").test_client()
    answer = client.post("/tasks/settle", headers=task_headers(), data=b"{}")
    (record,) = store.list_runs()
    assert (answer.status_code, answer.headers["X-Tasklease-Outcome"]) == (200, "processed")
    assert (len(calls), effects(store)) == (1, 1)
    assert record.status is RunStatus.COMPLETED
    assert len(renewals) >= 2 and None not in renewals  # Renewed meanwhile, never lost.
