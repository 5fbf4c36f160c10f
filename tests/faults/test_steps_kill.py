"""Durable steps under SIGKILL and SIGSTOP, and a continuation chain through the emulator:
real gunicorn workers, a real SQLite store.

Every step's effect lands once per run (the step key honoured downstream), every run
completes, no step's function runs again after its record was written, a frozen attempt's
late step is refused, and a chain of continuations with injected duplicates and lost
responses creates each continuation once and completes once, with the last state.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tasklease.emulator import CloudTasksEmulator, Faults
from tasklease.plumbing.serve import free_port
from tasklease.producer import Producer
from tasklease.worker.core import steps
from tasklease.worker.core.records import RunStatus
from tests.faults.harness import (
    FULL,
    Answer,
    Backend,
    Deliverer,
    FaultServer,
    scale,
    sqlite_records,
)
from tests.faults.steps_ledger import StepsLedger

pytestmark = pytest.mark.faults


def _payload(key: str) -> dict[str, float]:
    return {"sleep": round(random.Random(key).uniform(0.01, 0.12), 3)}


def test_sigkill_at_random_points_never_repeats_a_recorded_step(
    tmp_path: Path, backend: Backend
) -> None:
    if not FULL and backend.name != "sqlite":
        pytest.skip("on SQLite only outside the full suite (make faults)")
    rng = random.Random(20261201)
    keys = [f"steps-{n:04d}" for n in range(scale(40, 200))]
    deliverer = Deliverer("steps", handler="steps")
    kills = 0
    with FaultServer(tmp_path, store=backend.url, workers=2, env=backend.env) as server:
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
    records = backend.records()
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
        f"\nsteps-kill[{backend.name}]: runs={len(keys)} kills={kills} step_calls={len(calls)} "
        f"effects={len(effects)} calls_repeated_before_their_record={repeated}"
    )
    assert kills > 0


def test_a_frozen_attempts_late_step_is_refused_and_the_takeovers_stand(
    tmp_path: Path,
) -> None:
    key, payload = "frozen-1", {"sleep": 1.0}
    deliverer = Deliverer("steps", handler="steps")
    ledger = StepsLedger(tmp_path / "steps.db")
    first: list[Answer] = []
    with FaultServer(tmp_path, store=f"sqlite:///{tmp_path}/runs.db", workers=2) as server:
        sending = threading.Thread(
            target=lambda: first.append(deliverer.deliver(server.url, key, payload))
        )
        sending.start()
        deadline = time.monotonic() + 60
        while len(ledger.pids()) < 2:  # Inside step-1: step-0 is recorded.
            assert time.monotonic() < deadline, "the handler never reached its second step"
            time.sleep(0.02)
        frozen = ledger.pids()[0]
        os.kill(frozen, signal.SIGSTOP)  # No renewals, no progress: the lease runs out.
        try:
            deliverer.until_done([key], server.url, lambda _: payload, timeout=120)
        finally:
            os.kill(frozen, signal.SIGCONT)
        sending.join(timeout=60)
    records = sqlite_records(tmp_path / "runs.db")
    (record,) = records.values()
    recorded = steps.steps_of(record)
    calls = ledger.calls()
    stale_attempt = calls[0][2]
    assert record.status is RunStatus.COMPLETED
    assert first and first[0].outcome == "lost_claim"  # Its late step-1 result was refused.
    assert recorded["step-0"].attempt_id == stale_attempt
    assert {recorded[f"step-{i}"].attempt_id for i in range(1, 5)} == {record.attempt_id}
    assert record.attempt_id != stale_attempt
    # The frozen attempt's step-1 ran (before the freeze) and its effect was de-duplicated
    # by the step key: each step's effect is applied once.
    assert sorted(step for _, step, _ in ledger.effects()) == [f"step-{i}" for i in range(5)]
    assert "step-1" in {s for _, s, a in calls if a == stale_attempt}


def test_a_continuation_chain_through_the_emulator_survives_duplicates_and_lost_replies(
    tmp_path: Path,
) -> None:
    length = scale(50, 50)
    queue = "projects/p/locations/us-central1/queues/chain"
    port = free_port()
    faults = Faults(lost_response=0.3, duplicate=0.2, seed=29)
    with CloudTasksEmulator(data_dir=tmp_path / "emulator", faults=faults) as emulator:
        emulator.create_queue(
            queue, retryConfig={"minBackoff": "0.1s", "maxBackoff": "0.5s", "maxAttempts": -1}
        )
        env = {
            "TASKLEASE_PROJECT": "p",
            "TASKLEASE_LOCATION": "us-central1",
            "TASKLEASE_QUEUE": "chain",
            "TASKLEASE_WORKER_URL": f"http://127.0.0.1:{port}",
            "TASKLEASE_TASKS_ENDPOINT": emulator.url,
        }
        store = f"sqlite:///{tmp_path}/runs.db"
        with FaultServer(tmp_path, store=store, workers=2, port=port, env=env) as server:
            producer = Producer("p", "us-central1", "chain", server.url,
                                tasks_endpoint=emulator.url)  # fmt: skip
            producer.enqueue("chain", {"length": length}, key="chain-1")
            deadline = time.monotonic() + 240
            while True:
                records = sqlite_records(tmp_path / "runs.db")
                if records and all(r.status is RunStatus.COMPLETED for r in records.values()):
                    break
                assert time.monotonic() < deadline, "the chain did not complete"
                time.sleep(0.2)
            emulator.join(timeout=120)
            deliveries = emulator.deliveries()
    (record,) = records.values()
    ledger = StepsLedger(tmp_path / "steps.db")
    names = {d.name for d in deliveries}
    faulted = Counter(d.fault for d in deliveries)
    ran = [d for d in deliveries if d.outcome == "processed"]
    print(
        f"\nsteps-chain: deliveries={len(deliveries)} tasks={len(names)} "
        f"lost_responses={faulted['lost_response']} duplicates={faulted['duplicate']} "
        f"handler_runs={len(ran)} step_calls={len(ledger.calls())}"
    )
    assert len(names) == length  # The first task and each continuation: created once.
    assert faulted["lost_response"] > 0 and faulted["duplicate"] > 0
    assert record.result == {"done": length - 1}
    assert steps.continuation_of(record).seq == length - 1
    # Each continuing delivery's step is dropped with its continuation: the last one's stays.
    assert list(steps.steps_of(record)) == [f"segment-{length - 1}"]
    assert len(ledger.effects()) == length
    assert len(ledger.calls()) == length  # No segment ran twice.
    assert Counter(d.name for d in ran) == dict.fromkeys(names, 1)  # Each delivery ran once.
