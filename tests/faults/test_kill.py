"""Scenario 2: worker processes die (SIGKILL) or freeze (SIGSTOP) mid-handler.

After a kill the run's lease expires and a retry takes it over with a higher fencing token;
the fenced downstream then refuses anything the old attempt still tries to write, and
acknowledges (without repeating) an effect the killed attempt made before it could record
its completion.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tasklease.worker.core.records import RunStatus
from tests.faults.downstream import ALREADY_APPLIED, APPLIED, REFUSED, Downstream, Execution
from tests.faults.harness import (
    Answer,
    Backend,
    Deliverer,
    FaultServer,
    Tally,
    overlaps,
    scale,
    scenario,
    sqlite_records,
    tally,
    unclaimed,
)

pytestmark = pytest.mark.faults


def _payload(key: str) -> dict[str, Any]:
    """The same body on every delivery of a key, as Cloud Tasks retries it."""
    rng = random.Random(key)
    return {"sleep": round(rng.uniform(0.2, 1.5), 3), "steps": 3, "check": True,
            "after": round(rng.uniform(0.0, 0.5), 3)}  # fmt: skip


def _wait_for(condition: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError("condition not met")


def test_sigkill_at_random_points_then_restart_completes_every_run_once(
    tmp_path: Path, server_kind: str, backend_sql: Backend, report: Callable[[str, Tally], None]
) -> None:
    rng = random.Random(20261130)
    keys = [f"kill-{n:04d}" for n in range(scale(40, 200))]
    rounds, kills_per_round = scale(3, 8), 3
    deliverer = Deliverer("kill")
    killed_at: dict[int, float] = {}
    restarts = 0
    server = FaultServer(
        tmp_path, store=backend_sql.url, workers=2, env=backend_sql.env, server=server_kind
    )
    with server:
        for round_number in range(rounds):
            pending = sorted(set(keys) - deliverer.done())
            sending = threading.Thread(
                target=deliverer.deliver_all,
                args=([(server.url, key, _payload(key)) for key in pending], 16),
            )
            sending.start()
            for kill in range(kills_per_round):
                time.sleep(rng.uniform(0.3, 1.2))
                if round_number == 1 and kill == kills_per_round - 1:
                    # The whole server dies, as with its host; then it is started again.
                    now = time.time()
                    for pid in server.kill_all():
                        killed_at[pid] = now
                    server.start()
                    restarts += 1
                    continue
                pids = server.worker_pids()
                if pids:
                    pid = rng.choice(pids)
                    killed_at[pid] = time.time()
                    os.kill(pid, signal.SIGKILL)
            sending.join()
            server.wait_for_workers(2)
        deliverer.until_done(keys, server.url, _payload, timeout=300)

    downstream = Downstream(tmp_path / "downstream.db")
    executions = downstream.executions()
    writes = downstream.writes()
    never_ended = [e for e in executions if e.ended is None]
    records = backend_sql.records()
    counts = tally(
        keys,
        deliverer.answers,
        downstream,
        records,
        kills=len(killed_at),
        killed_mid_handler=len(never_ended),
        server_restarts=restarts,
        effects_applied=writes[APPLIED],
        retried_after_effect=writes[ALREADY_APPLIED],
        late_writes_refused=writes[REFUSED],
    )
    report(scenario("kill", server_kind, backend_sql), counts)
    assert counts.lost == 0
    assert writes[APPLIED] == len(keys)
    assert never_ended, "no kill landed inside a handler: the scenario tested nothing"
    assert {e.pid for e in never_ended} <= set(killed_at)  # Only killed processes vanished.
    assert overlaps(executions, killed_at) == []
    assert unclaimed(executions, records) == []
    assert {r.status for r in records.values()} == {RunStatus.COMPLETED}


def test_a_frozen_attempt_whose_lease_was_taken_over_has_its_late_write_refused(
    tmp_path: Path, report: Callable[[str, Tally], None]
) -> None:
    key, payload = "late-1", {"sleep": 1.0}
    deliverer = Deliverer("late")
    downstream = Downstream(tmp_path / "downstream.db")
    first: list[Answer] = []
    with FaultServer(tmp_path, store=f"sqlite:///{tmp_path}/runs.db", workers=2) as server:
        sending = threading.Thread(
            target=lambda: first.append(deliverer.deliver(server.url, key, payload))
        )
        sending.start()
        stale: Execution = _wait_for(lambda: next(iter(downstream.executions()), None))
        os.kill(stale.pid, signal.SIGSTOP)  # Frozen mid-handler: no renewals, no progress.
        try:
            # Retries get 409 until the frozen attempt's lease expires, then one takes over.
            deliverer.until_done([key], server.url, lambda _: payload, timeout=120)
        finally:
            os.kill(stale.pid, signal.SIGCONT)
        sending.join(timeout=60)
    executions = downstream.executions()
    records = sqlite_records(tmp_path / "runs.db")
    (record,) = records.values()
    writes = downstream.writes()
    counts = tally(
        [key],
        deliverer.answers,
        downstream,
        records,
        late_writes_refused=writes[REFUSED],
        stale_answer=first[0].outcome,
    )
    report("kill[sqlite] frozen attempt", counts)
    assert counts.lost == 0
    assert len(executions) == 2
    assert writes == Counter({APPLIED: 1, REFUSED: 1})
    assert downstream.refused_attempts() == {stale.attempt_id}
    assert first[0].status == 409 and first[0].outcome == "lost_claim"
    assert record.status is RunStatus.COMPLETED
    assert record.fencing_token == 2 and record.attempt_id != stale.attempt_id


def test_a_crash_between_the_side_effect_and_the_completion_record_is_not_repeated(
    tmp_path: Path, report: Callable[[str, Tally], None]
) -> None:
    key, payload = "crash-1", {"after": 30.0}  # Killed in the window after the effect.
    deliverer = Deliverer("crash")
    downstream = Downstream(tmp_path / "downstream.db")
    with FaultServer(tmp_path, store=f"sqlite:///{tmp_path}/runs.db", workers=2) as server:
        sending = threading.Thread(target=deliverer.deliver, args=(server.url, key, payload))
        sending.start()
        _wait_for(lambda: downstream.effects()[key])
        (victim,) = downstream.executions()
        killed_at = {victim.pid: time.time()}
        os.kill(victim.pid, signal.SIGKILL)
        sending.join(timeout=60)
        server.wait_for_workers(2)
        deliverer.until_done([key], server.url, lambda _: {}, timeout=120)
    executions = downstream.executions()
    records = sqlite_records(tmp_path / "runs.db")
    writes = downstream.writes()
    counts = tally(
        [key],
        deliverer.answers,
        downstream,
        records,
        effects_applied=writes[APPLIED],
        retried_after_effect=writes[ALREADY_APPLIED],
    )
    report("kill[sqlite] crash after effect", counts)
    assert counts.lost == 0
    # The handler ran twice (the completion was never recorded), the effect happened once:
    # a downstream without the idempotent check would have repeated it.
    assert len(executions) == 2
    assert writes == Counter({APPLIED: 1, ALREADY_APPLIED: 1})
    assert overlaps(executions, killed_at) == []
    assert unclaimed(executions, records) == []
