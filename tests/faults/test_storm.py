"""Scenario 1: a duplicate storm. Every task is delivered 5 times at once, across 4 worker
processes sharing one store; exactly one delivery per task runs the handler."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.downstream import Downstream
from tests.faults.harness import Deliverer, FaultServer, Tally, scale, sqlite_records, tally

pytestmark = pytest.mark.faults

COPIES = 5


def test_duplicate_storm_runs_each_task_once(
    tmp_path: Path, report: Callable[[str, Tally], None]
) -> None:
    tasks = scale(200, 1000)
    keys = [f"storm-{n:05d}" for n in range(tasks)]
    deliverer = Deliverer("storm")
    with FaultServer(tmp_path, store=f"sqlite:///{tmp_path}/runs.db", workers=4) as server:
        # The copies of one task are adjacent in the submission order: they run concurrently.
        deliverer.deliver_all(
            [(server.url, key, {"sleep": 0.05}) for key in keys for _ in range(COPIES)],
            concurrency=40,
        )
    downstream = Downstream(tmp_path / "downstream.db")
    records = sqlite_records(tmp_path / "runs.db")
    counts = tally(keys, deliverer.answers, downstream, records)
    outcomes = Counter(a.outcome for a in deliverer.answers)
    pids = {e.pid for e in downstream.executions()}
    counts.extra.update(
        processed=outcomes["processed"], in_progress=outcomes["in_progress"], processes=len(pids)
    )
    report("storm[sqlite]", counts)
    assert counts.delivered == tasks * COPIES
    assert outcomes["processed"] == tasks
    assert counts.executed == tasks
    assert counts.duplicates_absorbed == tasks * (COPIES - 1)
    assert counts.lost == 0
    assert Counter(e.key for e in downstream.executions()) == Counter(dict.fromkeys(keys, 1))
    assert len(pids) >= 2  # Runs were claimed by competing processes.
