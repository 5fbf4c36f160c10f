"""A ``manual_run_margin`` below ``MAX_CLOCK_SKEW`` is refused, and no margin lets a clock
running behind read the slot's own delivery as a manual run (review finding: with a margin of
0 and the worker's clock 10 ms behind, the slot's delivery counted as manual and its retry
after a lost response ran the handler again; a proxy job started a second execution)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tasklease.errors import ConfigurationError
from tasklease.worker.core import constants as c
from tasklease.worker.core.identity import Kind, parse_identity
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import Router
from tasklease.worker.serving.app import create_app
from tasklease.worker.stores.memory.store import MemoryStore
from tests.support.helpers import T0, FakeClock, job_headers

BEHIND = timedelta(milliseconds=10)


@pytest.mark.parametrize("margin", [timedelta(0), c.MAX_CLOCK_SKEW - timedelta(milliseconds=1)])
def test_a_router_refuses_a_manual_run_margin_below_the_clock_skew_bound(
    margin: timedelta,
) -> None:
    with pytest.raises(ConfigurationError, match="MAX_CLOCK_SKEW"):
        Router(manual_run_margin=margin)


def test_a_scheduled_handler_refuses_a_manual_run_margin_below_the_clock_skew_bound() -> None:
    router = Router()
    with pytest.raises(ConfigurationError, match="MAX_CLOCK_SKEW"):
        router.scheduled("nightly", manual_run_margin=timedelta(0))(lambda ctx: None)


def test_the_slots_own_delivery_read_early_by_a_clock_behind_is_never_manual() -> None:
    headers = job_headers("nightly", "2026-10-16T12:00:00Z")
    for margin in (timedelta(0), c.MAX_CLOCK_SKEW):
        identity = parse_identity(
            Kind.SCHEDULER,
            "nightly",
            lambda name: [headers[name]] if name in headers else [],
            {},
            received_at=T0 - BEHIND,
            manual_run_margin=margin,
        )
        assert not identity.manual


def test_a_slot_retried_after_a_lost_response_runs_once_with_the_smallest_margin() -> None:
    router = Router()
    runs: list[str] = []

    @router.scheduled("nightly", manual_run_margin=c.MAX_CLOCK_SKEW)
    def nightly(ctx: TaskContext) -> None:
        runs.append(ctx.run_id)

    clock = FakeClock(T0 - BEHIND)  # The worker's clock runs 10 ms behind Scheduler's.
    client = create_app(router, store=MemoryStore(), auth="none", clock=clock).test_client()
    headers = job_headers("nightly", "2026-10-16T12:00:00Z")
    first = client.post("/jobs/nightly", headers=headers)
    clock.advance(timedelta(seconds=5))  # Its answer was lost: Scheduler retries.
    retry = client.post("/jobs/nightly", headers=headers)
    outcomes = [r.headers["X-Tasklease-Outcome"] for r in (first, retry)]
    assert outcomes == ["processed", "duplicate"]
    assert len(runs) == 1
