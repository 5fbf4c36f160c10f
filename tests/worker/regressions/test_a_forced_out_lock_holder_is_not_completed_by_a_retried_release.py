"""Review finding: an operator's forced release (``tasklease locks release --force``) frees a
lock while its holder still runs, and the next run of the key takes it: the two handlers
overlap. The holder's lease still holds by its own clock (no renewal has come since), so when
its first lock release fails before reaching the store and the retry is refused, the rule
"a retried release sent while the lease held is no takeover" records its completion. Without
the transient error the same refusal answers ``lost_claim``: the outcome must not hang on it.
A retried release now counts as done only when the holder it finds took the lock after the
first try was sent, less the clock skew allowed between instances."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tasklease.errors import StoreUnavailable
from tasklease.worker.core import constants as c
from tasklease.worker.core.records import LockRequest
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.base.store import Moment
from tasklease.worker.stores.memory.store import MemoryStore
from tests.support.helpers import task_headers


class FirstReleaseNeverSent(MemoryStore):
    """The holder's first lock release fails before it reaches the store, when asked to."""

    def __init__(self, *, fail_first_release: bool) -> None:
        super().__init__()
        self.fail_next_release = fail_first_release

    def release_lock(self, name: str, attempt_id: str, now: Moment) -> bool:
        if self.fail_next_release:
            self.fail_next_release = False
            raise StoreUnavailable("the connection dropped before the release was sent")
        return super().release_lock(name, attempt_id, now)


@pytest.mark.parametrize("fail_first_release", [False, True], ids=["first-try", "retried"])
def test_a_holder_forced_out_while_it_ran_does_not_record_its_completion(
    fail_first_release: bool,
) -> None:
    router = Router()
    store = FirstReleaseNeverSent(fail_first_release=fail_first_release)
    overlapped: list[bool] = []

    @router.task("post_ledger", concurrency_key=lambda payload: payload["account"])
    def post_ledger(payload: Any, ctx: TaskContext) -> None:
        assert ctx.lock is not None
        # An operator forces the lock free while this handler runs; the next run of the key
        # takes it at once and runs beside this one.
        forced = store.operator_release_lock(ctx.lock, datetime.now(UTC), force=True)
        assert forced.forced
        request = LockRequest(ctx.lock, "the-next-run", "its-attempt", timedelta(seconds=30))
        overlapped.append(store.acquire_lock(request, datetime.now(UTC)).acquired)
        # The handler goes on beside the next run for longer than the clock skew allowed
        # between instances: a holder that took the lock within it of this run's release
        # cannot be told from one that took it after (only longer under load).
        time.sleep(c.MAX_CLOCK_SKEW.total_seconds() + 0.2)
        assert not ctx.lease_lost  # No renewal came since: by its own clock it still holds.

    client = create_app(router, store=store, auth="none").test_client()
    body = json.dumps({"account": "acct-1"})
    reply = client.post("/tasks/post_ledger", headers=task_headers(), data=body)
    assert overlapped == [True]
    assert reply.headers["X-Tasklease-Outcome"] == "lost_claim", reply.get_json()
