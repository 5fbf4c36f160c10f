"""A continuation chain is how the README runs a long job ("a 2-hour job runs as a chain of
deliveries"): every delivery's steps stay in the run record for the rest of the chain and
count against MAX_RUN_STEP_BYTES, so the README's own reindex pattern (one step per page,
one page per delivery) dead-letters the run after about 800 pages of 500 bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasklease import protocol
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core import steps
from tasklease.worker.core.identity import DeliveryIdentity, Kind
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import CapturingProducer, FakeClock, task_headers

PAGES = 900  # Each page's summary about 500 bytes: well under the per-step cap.


def test_a_chain_of_nine_hundred_one_page_deliveries_completes_its_run(tmp_path: Path) -> None:
    def reindex(job: Any, ctx: TaskContext) -> Any:
        cursor = (ctx.state or {}).get("cursor", 0)
        page = ctx.step(
            f"page-{cursor}",
            lambda: {"ids": list(range(cursor * 100, cursor * 100 + 100)), "next": cursor + 1},
        )
        if page["next"] < PAGES:
            ctx.continue_later({"cursor": page["next"]}, delay=0)
            return None
        return {"pages": ctx.continuation + 1}

    router = Router()
    router.task("h")(reindex)
    router.use_producer(CapturingProducer())  # type: ignore[arg-type]
    store = SqliteStore(tmp_path / "runs.db")
    client = create_app(router, store=store, auth="none", clock=FakeClock()).test_client()
    run_id = DeliveryIdentity(Kind.TASK, "h", queue="default", task_name="t-1").run_id
    outcomes = []
    for seq in range(PAGES):
        extra = {protocol.CONTINUATION_HEADER: f"{run_id}:{seq}"} if seq else {}
        reply = client.post(
            "/tasks/h",
            headers=task_headers(task=f"c-{seq}" if seq else "t-1") | extra,
            data=json.dumps({}),
        )
        outcomes.append(reply.headers[protocol.OUTCOME_HEADER])
        if outcomes[-1] != "processed":
            break
    record = store.get(run_id)
    assert record is not None
    assert (record.status, record.error) == (RunStatus.COMPLETED, None)
    assert record.result == {"pages": PAGES}


def test_a_step_name_used_again_in_a_later_delivery_runs_again_under_its_own_key(
    tmp_path: Path,
) -> None:
    calls: list[tuple[int, str]] = []

    def handler(job: Any, ctx: TaskContext) -> Any:
        def fetch() -> int:
            calls.append((ctx.continuation, ctx.step_key("fetch")))
            return ctx.continuation

        got = ctx.step("fetch", fetch)
        if ctx.continuation == 0:
            ctx.continue_later(None)
            return None
        return got

    router = Router()
    router.task("h")(handler)
    router.use_producer(CapturingProducer())  # type: ignore[arg-type]
    store = SqliteStore(tmp_path / "runs.db")
    client = create_app(router, store=store, auth="none", clock=FakeClock()).test_client()
    run_id = DeliveryIdentity(Kind.TASK, "h", queue="default", task_name="t-1").run_id
    client.post("/tasks/h", headers=task_headers(task="t-1"), data=json.dumps({}))
    headers = task_headers(task="c-1") | {protocol.CONTINUATION_HEADER: f"{run_id}:1"}
    reply = client.post("/tasks/h", headers=headers, data=json.dumps({}))
    assert reply.get_json()["result"] == 1  # Not delivery 0's result replayed.
    (first, key0), (second, key1) = calls
    assert (first, second) == (0, 1)
    assert key0 == steps.step_key(run_id, "fetch") != key1  # Delivery 0's key is unchanged.
