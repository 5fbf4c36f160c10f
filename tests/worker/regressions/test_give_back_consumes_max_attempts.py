"""Finding: a claim given back unused (the store was too slow to grant it) still counts as an
attempt, so with ``max_attempts`` the run is dead-lettered without its handler ever running."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from tasklease.worker.core.records import Claim, ClaimRequest
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.base.store import Moment
from tasklease.worker.stores.memory.store import MemoryStore
from tests.support.helpers import FakeClock, task_headers


class SlowFirstClaim(MemoryStore):
    """The first claim is granted only after most of a 1 s lease has passed (a loaded store)."""

    def __init__(self) -> None:
        super().__init__()
        self.slow = True

    def claim(self, request: ClaimRequest, now: Moment) -> Claim:
        outcome = super().claim(request, now)
        if self.slow:
            self.slow = False
            time.sleep(0.9)  # Only ever longer on a loaded machine: the refusal stays certain.
        return outcome


def test_a_claim_given_back_unused_does_not_use_up_max_attempts(clock: FakeClock) -> None:
    router = Router()
    calls: list[int] = []

    @router.task("charge", lease=timedelta(seconds=1), max_attempts=1)
    def charge(payload: Any, ctx: TaskContext) -> str:
        calls.append(1)
        return "charged"

    app = create_app(router, store=SlowFirstClaim(), auth="none", clock=clock)
    client = app.test_client()
    first = client.post("/tasks/charge", headers=task_headers(), data=json.dumps({}))
    assert first.status_code == 503  # Refused: the claim came back with its lease nearly spent.
    assert calls == []
    retry = client.post(
        "/tasks/charge", headers=task_headers(retry=1, execution=0), data=json.dumps({})
    )
    assert retry.headers["X-Tasklease-Outcome"] == "processed", retry.get_json()
    assert calls == [1]
