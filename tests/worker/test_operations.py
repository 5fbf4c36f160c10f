"""The operators' service behind `tasklease runs` and the dashboard: replay, stuck, summaries."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease.jobs import Job
from tasklease.producer import MemoryTransport, Producer
from tasklease.worker import PermanentFailure, Router, TaskContext, create_app
from tasklease.worker.core.records import RunStatus
from tasklease.worker.operate.operations import (
    OperationRefused,
    Operations,
    replay_key,
    run_summary,
)
from tasklease.worker.operate.stuck_schedules import load_schedules
from tasklease.worker.stores import MemoryStore
from tests.support.helpers import T0, FakeClock, claim_request

WORKER = "https://worker.example"


class Shop:
    """A worker whose ``charge`` handler fails permanently until told otherwise."""

    def __init__(self) -> None:
        self.failing = True
        self.charged: list[int] = []
        router = Router()

        @router.task("charge")
        def charge(payload: Any, ctx: TaskContext) -> dict[str, int]:
            if self.failing:
                raise PermanentFailure("card declined")
            self.charged.append(payload["order"])
            return {"order": payload["order"]}

        self.store = MemoryStore()
        self.client = create_app(router, store=self.store, auth="none").test_client()
        self.queue = MemoryTransport()
        self.producer = Producer("p", "l", "q", WORKER, transport=self.queue)

    def deliver_pending(self) -> list[int]:
        return [self.queue.deliver(t, self.client.post, "q") for t in self.queue.pending()]


def test_replay_re_enqueues_a_dead_letter_once_and_links_both_runs() -> None:
    shop = Shop()
    shop.producer.enqueue("charge", {"order": 7}, key="order-7")
    assert shop.deliver_pending() == [200]  # A permanent failure is answered 200: no retry.
    [dead] = shop.store.query_runs().runs
    assert dead.status is RunStatus.FAILED
    shop.failing = False
    operations = Operations(shop.store, shop.producer)
    first = operations.replay(dead.run_id)
    second = operations.replay(dead.run_id)
    assert (first.created, second.created) == (True, False)
    assert first.replay_run_id == second.replay_run_id
    assert len(shop.queue.tasks) == 2  # The original task and one replay.
    assert shop.queue.tasks[1].request.task_id.startswith(first.task_name.rsplit("/", 1)[-1])
    assert shop.deliver_pending() == [200]
    assert shop.charged == [7]
    replayed = shop.store.get(first.replay_run_id)
    assert replayed is not None
    assert (replayed.status, replayed.replay_of, replayed.attempts) == (
        RunStatus.COMPLETED,
        dead.run_id,
        1,
    )
    assert shop.store.get(dead.run_id).replayed_as == first.replay_run_id  # type: ignore[union-attr]
    assert replay_key(dead.run_id) == f"replay/{dead.run_id}"


def test_only_failed_task_runs_with_a_json_payload_are_replayed() -> None:
    store = MemoryStore()
    producer = Producer("p", "l", "q", WORKER, transport=MemoryTransport())
    operations = Operations(store, producer, clock=FakeClock(T0))
    store.claim(claim_request("live"), T0)
    store.claim(claim_request("garbled"), T0)
    store.fail("garbled", "attempt-1", "payload is not valid JSON", T0, "{not json")
    for run_id, reason in (
        ("live", "only failed"),
        ("garbled", "not JSON"),
        ("missing", "no such run"),
    ):
        with pytest.raises(OperationRefused, match=reason):
            operations.replay(run_id)


def test_replay_without_a_configured_producer_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("TASKLEASE_PROJECT", "GOOGLE_CLOUD_PROJECT", "TASKLEASE_WORKER_URL"):
        monkeypatch.delenv(name, raising=False)
    store = MemoryStore()
    store.claim(claim_request(), T0)
    store.fail("run-1", "attempt-1", "bad", T0, "{}")
    with pytest.raises(OperationRefused, match="TASKLEASE_PROJECT"):
        Operations(store, clock=FakeClock(T0)).replay("run-1")


def test_stuck_lists_crashed_attempts_and_jobs_that_missed_their_slot(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(
        '[[job]]\nname = "nightly"\nschedule = "0 3 * * *"\n\n'
        '[[job]]\nname = "hourly"\nschedule = "0 * * * *"\ntime_zone = "Europe/Paris"\n'
    )
    schedules = load_schedules(jobs)
    assert schedules[1] == Job("hourly", "0 * * * *", "Europe/Paris")
    clock = FakeClock(T0)  # 12:00 UTC.
    store = MemoryStore()
    nightly = {"job_name": "nightly", "schedule_time": "2026-10-16T03:00:00Z"}
    store.claim(claim_request("n", kind="scheduler", handler="nightly", identity=nightly), T0)
    store.complete("n", "attempt-1", None, T0)
    hourly = {"job_name": "hourly", "schedule_time": "2026-10-16T10:00:00Z"}
    store.claim(claim_request("h", kind="scheduler", handler="hourly", identity=hourly), T0)
    store.complete("h", "attempt-1", None, T0)
    store.claim(claim_request("crashed"), T0 - timedelta(hours=1))
    report = Operations(store, clock=clock).stuck(schedules)
    assert [r.run_id for r in report.runs] == ["crashed"]
    [late] = report.jobs
    assert late.name == "hourly"
    assert late.due == T0 - timedelta(minutes=60)  # 11:00 UTC: the slot 15 minutes' grace covers.
    assert late.last_success == T0 - timedelta(hours=2)
    assert not report.empty


def test_a_summary_gives_sizes_not_bodies() -> None:
    store = MemoryStore()
    store.claim(claim_request(), T0)
    store.complete("run-1", "attempt-1", '{"é":1}', T0 + timedelta(seconds=2))
    summary = run_summary(store.get("run-1"), T0)  # type: ignore[arg-type]
    assert summary["result_bytes"] == len('{"é":1}'.encode())
    assert summary["duration_seconds"] == 2.0
    assert summary["claimed_at"] == "2026-10-16T12:00:00Z"
    assert "payload" not in summary and "result" not in summary
