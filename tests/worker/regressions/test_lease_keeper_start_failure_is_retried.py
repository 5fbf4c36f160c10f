"""Finding: the lease keeper recorded its process before its scheduler thread started, so one
failed start ("can't start new thread") ended renewals in that process for good: every later
handler ran without renewals and was taken over while still running. The delivery that hit
the failure answered 500 without running its handler, and its attempt still counted."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest

from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tests.support.helpers import task_headers
from tests.support.lease_threads import CountingStore, refuse_one_thread_start

LEASE = timedelta(seconds=1.5)  # Renewed every 0.5 s.


def test_a_failed_keeper_start_is_given_back_uncounted_and_retried_at_the_next_delivery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Refuses to start the first lease keeper thread.
    refused = refuse_one_thread_start(monkeypatch, lambda name: name == "tasklease-lease-keeper")
    store = CountingStore()
    router = Router()
    calls: list[int] = []

    @router.task("charge", lease=LEASE, max_attempts=1)
    def charge(payload: Any, ctx: TaskContext) -> str:
        calls.append(ctx.attempt)
        deadline = time.monotonic() + 10  # Renewals are due every 0.5 s: 20x margin.
        while store.renewals == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        return "renewed" if store.renewals else "never renewed"

    client = create_app(router, store=store, auth="none").test_client()
    first = client.post("/tasks/charge", headers=task_headers(), data=json.dumps({}))
    assert refused.is_set()
    assert first.status_code == 503, first.get_json()  # Given back, like other give-backs.
    assert "Retry-After" in first.headers
    assert calls == []
    retry = client.post("/tasks/charge", headers=task_headers(retry=1), data=json.dumps({}))
    # max_attempts=1 still allows this run: the given-back delivery was not an attempt.
    assert retry.headers["X-Tasklease-Outcome"] == "processed", retry.get_json()
    assert calls == [1]
    assert retry.get_json()["result"] == "renewed"
