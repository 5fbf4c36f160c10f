"""A manual run (``gcloud scheduler jobs run``) carries the next slot's schedule time, and the
slot's own delivery, when it comes, is taken for a retry of the manual run only while that run
waits for a retry of its Scheduler delivery. A manual run that continued (``continue_later``)
is released between two deliveries of its chain, but it waits for a continuation task, not for
the Scheduler: the slot's own delivery taken for it would be answered as a duplicate of the
chain (200) and the slot, whose Scheduler does not retry a 200, would never run."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease import protocol
from tasklease.errors import StoreUnavailable
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.base import retries as store_retries
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import CapturingProducer, FakeClock, job_headers, task_headers

SLOT = "2026-10-16T15:00:00Z"  # Three hours after the clock starts: "jobs run" sends it.


def _outcome(reply: Any) -> str:
    return str(reply.headers[protocol.OUTCOME_HEADER])


@pytest.mark.parametrize("between", ["released", "lease_ran_out"])
def test_the_slots_own_delivery_runs_while_a_manual_run_of_it_goes_on_in_continuations(
    tmp_path: Path, between: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    clock = FakeClock()
    seen: list[tuple[int, str]] = []
    crash = {"on": False}
    manual_run = [""]
    router = Router()

    @router.scheduled("nightly", lease=timedelta(seconds=30))
    def nightly(ctx: TaskContext) -> Any:
        manual_run[0] = manual_run[0] or ctx.run_id  # The first run is the manual one.
        seen.append((ctx.continuation, ctx.run_id))
        if crash["on"]:
            crash["on"] = False
            raise RuntimeError("the instance dies")  # Its release never lands (below).
        if ctx.run_id != manual_run[0]:
            return {"slot": True}  # The slot's own run: one delivery.
        page = (ctx.state or {"page": 0})["page"]
        if page < 2:
            ctx.continue_later({"page": page + 1}, delay=timedelta(seconds=30))
            return None
        return {"pages": page + 1}

    producer = CapturingProducer()
    router.use_producer(producer)  # type: ignore[arg-type]
    client = create_app(router, store=store, auth="none", clock=clock).test_client()

    def resume(seq: int, retry: int = 0) -> Any:
        headers = task_headers(queue="reports", task=f"c-{seq}", retry=retry) | {
            protocol.CONTINUATION_HEADER: f"{manual_run[0]}:{seq}"
        }
        return client.post("/jobs/nightly", headers=headers, data=b"null")

    manual = client.post("/jobs/nightly", headers=job_headers(schedule_time=SLOT))
    assert _outcome(manual) == "processed"
    (task,) = producer.tasks.values()
    assert task["headers"][protocol.CONTINUATION_HEADER] == f"{manual_run[0]}:1"
    if between == "lease_ran_out":  # Continuation 1's delivery dies holding the run.
        crash["on"] = True

        def unreachable(*args: Any, **kwargs: Any) -> bool:
            raise StoreUnavailable("the instance died before it could record anything")

        with monkeypatch.context() as patched:
            patched.setattr(store, "release", unreachable)
            patched.setattr(store_retries, "FINISH_RETRY_PAUSES", ())  # No waits between.
            assert resume(1).status_code == 503  # Nothing recorded: the run stays held.
        held = store.get(manual_run[0])
        assert held is not None and held.status is RunStatus.IN_PROGRESS
    clock.advance(timedelta(hours=3))  # The slot comes while the manual run goes on.
    slot = client.post("/jobs/nightly", headers=job_headers(schedule_time=SLOT))
    assert (_outcome(slot), slot.status_code) == ("processed", 200)
    slot_runs = {run for _, run in seen} - {manual_run[0]}
    assert len(slot_runs) == 1
    (slot_run,) = slot_runs
    record = store.get(slot_run)
    assert record is not None and record.status is RunStatus.COMPLETED
    # The manual run goes on, and completes, as if the slot had never come.
    for seq in (1, 2):
        assert _outcome(resume(seq, retry=1)) == "processed"
    manual_record = store.get(manual_run[0])
    assert manual_record is not None and manual_record.status is RunStatus.COMPLETED
    assert manual_record.result == {"pages": 3}
