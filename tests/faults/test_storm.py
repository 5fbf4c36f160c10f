"""Scenario 1: a duplicate storm. Every task is delivered 5 times at once, across 4 worker
processes sharing one store; exactly one delivery per task runs the handler."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.downstream import Downstream
from tests.faults.harness import (
    Backend,
    Deliverer,
    FaultServer,
    Tally,
    scale,
    scenario,
    tally,
)

pytestmark = pytest.mark.faults

COPIES = 5


def test_duplicate_storm_runs_each_task_once(
    tmp_path: Path, server_kind: str, backend_sql: Backend, report: Callable[[str, Tally], None]
) -> None:
    tasks = scale(200, 1000)
    keys = [f"storm-{n:05d}" for n in range(tasks)]
    deliverer = Deliverer("storm")
    with FaultServer(
        tmp_path, store=backend_sql.url, workers=4, env=backend_sql.env, server=server_kind
    ) as server:
        # The copies of one task are adjacent in the submission order: they run concurrently.
        deliverer.deliver_all(
            [(server.url, key, {"sleep": 0.05}) for key in keys for _ in range(COPIES)],
            concurrency=40,
        )
        # A task none of whose copies finished (the store answered 503) is retried.
        deliverer.until_done(keys, server.url, lambda _: {"sleep": 0.05})
    downstream = Downstream(tmp_path / "downstream.db")
    records = backend_sql.records()
    counts = tally(keys, deliverer.answers, downstream, records)
    outcomes = Counter(a.outcome for a in deliverer.answers)
    pids = {e.pid for e in downstream.executions()}
    counts.extra.update(
        processed=outcomes["processed"],
        in_progress=outcomes["in_progress"],
        store_unavailable_503=outcomes["unavailable"],
        processes=len(pids),
    )
    report(scenario("storm", server_kind, backend_sql), counts)
    assert counts.delivered >= tasks * COPIES
    assert outcomes["processed"] == tasks
    assert counts.executed == tasks
    # Every other delivery was absorbed without running: answered from the record (200), told
    # the run is in progress (409), or, rarely, told the store was too busy to answer (503).
    assert set(outcomes) <= {"processed", "duplicate", "in_progress", "unavailable"}
    assert counts.duplicates_absorbed + outcomes["unavailable"] == counts.delivered - tasks
    assert counts.lost == 0
    assert Counter(e.key for e in downstream.executions()) == Counter(dict.fromkeys(keys, 1))
    assert len(pids) >= 2  # Runs were claimed by competing processes.
