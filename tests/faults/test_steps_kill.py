"""Durable steps under SIGKILL and SIGSTOP: real gunicorn workers, a real SQLite store.

Every step's effect lands once per run (the step key honoured downstream), every run
completes, and no step's function runs again after its record was written.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tasklease.worker.core import steps
from tasklease.worker.core.records import RunStatus
from tests.faults.harness import Deliverer, FaultServer, scale, sqlite_records
from tests.faults.steps_ledger import StepsLedger

pytestmark = pytest.mark.faults


def _payload(key: str) -> dict[str, float]:
    return {"sleep": round(random.Random(key).uniform(0.01, 0.12), 3)}


def test_sigkill_at_random_points_never_repeats_a_recorded_step(tmp_path: Path) -> None:
    rng = random.Random(20261201)
    keys = [f"steps-{n:04d}" for n in range(scale(40, 200))]
    deliverer = Deliverer("steps", handler="steps")
    kills = 0
    with FaultServer(tmp_path, store=f"sqlite:///{tmp_path}/runs.db", workers=2) as server:
        for _ in range(scale(3, 6)):
            pending = sorted(set(keys) - deliverer.done())
            sending = threading.Thread(
                target=deliverer.deliver_all,
                args=([(server.url, key, _payload(key)) for key in pending], 8),
            )
            sending.start()
            for _ in range(3):
                time.sleep(rng.uniform(0.2, 0.8))
                pids = server.worker_pids()
                if pids:
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    kills += 1
            sending.join()
            server.wait_for_workers(2)
        deliverer.until_done(keys, server.url, _payload, timeout=300)

    ledger = StepsLedger(tmp_path / "steps.db")
    records = sqlite_records(tmp_path / "runs.db")
    effects = ledger.effects()
    calls = ledger.calls()
    per_run: dict[str, list[str]] = defaultdict(list)
    for run_id, step, _ in effects:
        per_run[run_id].append(step)
    assert len(records) == len(keys)
    assert {r.status for r in records.values()} == {RunStatus.COMPLETED}
    names = [f"step-{i}" for i in range(5)]
    assert {run_id: sorted(s) for run_id, s in per_run.items()} == {
        run_id: names for run_id in records
    }
    # No call of a step after the call whose result was recorded: the recording attempt's
    # call is the last one of that step.
    last_call: dict[tuple[str, str], str] = {}
    for run_id, step, attempt_id in calls:
        last_call[run_id, step] = attempt_id
    for run_id, record in records.items():
        for name, done in steps.steps_of(record).items():
            assert last_call[run_id, name] == done.attempt_id, (run_id, name)
    repeated = len(calls) - len(effects)
    print(
        f"\nsteps-kill: runs={len(keys)} kills={kills} step_calls={len(calls)} "
        f"effects={len(effects)} calls_repeated_before_their_record={repeated}"
    )
    assert kills > 0
