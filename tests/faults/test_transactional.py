"""Scenario: crash after the effect, without downstream idempotency.

A handler whose effect is a plain ``UPDATE accounts SET balance = balance + 1`` (its task's
row; no key) is SIGKILLed at random points, before, after and between the effect and the
completion record. Registered ``transactional=True`` the effect commits with the record, so
every row ends at exactly 1. The same handler without it is the control: a kill after its
effect committed and before its record did makes the retry apply it again (a balance of 2).
The same statement in three transactional durable steps (``ledger_steps``) under the same
kills: each step's effect commits with the step's record, so every balance ends at 3 and no
step runs again after its record.
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

from tasklease.worker.core import steps
from tasklease.worker.core.records import RunStatus
from tests.faults import conftest
from tests.faults.harness import FULL, Backend, Deliverer, FaultServer, Tally, scale
from tests.faults.ledger import ENV_EFFECTS, STEPS, accounts_for

pytestmark = pytest.mark.faults


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The stores the scenario runs on: each has an ``Accounts`` in tests/faults/ledger.py."""
    return conftest._backend(request, tmp_path)


def _payload(key: str, backend: str) -> dict[str, Any]:
    """The same body on every delivery of a key: at least 0.1 s after the effect, the
    window a kill aims at. SQLite holds its one write lock for the whole transaction, so
    its handler is kept shorter."""
    rng = random.Random(key)
    longest = 0.25 if backend == "sqlite" else 0.6
    return {"before": round(rng.uniform(0, 0.1), 3), "after": round(rng.uniform(0.1, longest), 3)}


def _next_effect_pid(effects: Path, wait: float = 2.0) -> int | None:
    """The process of the next effect noted in ``effects`` within ``wait`` s, if any."""
    seen = len(effects.read_text().splitlines())
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        lines = effects.read_text().splitlines()
        if len(lines) > seen:
            return int(lines[-1].split()[0])
        time.sleep(0.005)
    return None


def _run(tmp_path: Path, backend: Backend, handler: str) -> tuple[dict[str, int], Tally, Any]:
    keys = [f"{handler}-{n:04d}" for n in range(scale(40, 200))]
    accounts = accounts_for(backend.url)
    accounts.create(backend.url, keys)
    effects = tmp_path / "effects.log"
    effects.touch()
    rng = random.Random(f"{handler}-{backend.name}")
    deliverer = Deliverer("ledger", handler=handler)
    kills = 0
    env = {**backend.env, ENV_EFFECTS: str(effects)}
    with FaultServer(tmp_path, store=backend.url, workers=2, env=env) as server:
        server.wait_for_workers(2)
        for _ in range(scale(3, 8)):
            pending = sorted(set(keys) - deliverer.done())
            sending = threading.Thread(
                target=deliverer.deliver_all,
                args=([(server.url, k, _payload(k, backend.name)) for k in pending], 16),
            )
            sending.start()
            for kill in range(scale(4, 6)):
                time.sleep(rng.uniform(0.2, 0.8))
                # Every other kill aims just after a fresh effect, at its process: still in
                # its handler (sleeping ``after``), before the run's record.
                latest = _next_effect_pid(effects) if kill % 2 else None
                if latest is not None:
                    time.sleep(rng.uniform(0, 0.05))
                pids = server.worker_pids()
                target = latest if latest in pids else rng.choice(pids or [0])
                if target:
                    os.kill(target, signal.SIGKILL)
                    kills += 1
            sending.join()
            server.wait_for_workers(2)
        deliverer.until_done(keys, server.url, lambda k: _payload(k, backend.name), timeout=300)
    balances = accounts.balances(backend.url)
    once = STEPS if handler == "ledger_steps" else 1  # A balance with each effect once.
    statements = Counter(line.split()[1] for line in effects.read_text().splitlines())
    records = backend.records()
    completed = sum(1 for r in records.values() if r.status is RunStatus.COMPLETED)
    counts = Tally(
        delivered=len(deliverer.answers),
        executed=sum(statements.values()),
        duplicates_absorbed=sum(
            n for o, n in deliverer.outcomes().items() if o in ("duplicate", "in_progress")
        ),
        lost=sum(1 for k in keys if balances.get(k, 0) < once),
        extra={
            "kills": kills,
            "completed": completed,
            "effect_reruns": sum(n - 1 for n in statements.values() if n > 1),
            "applied_twice_or_more": sum(1 for k in keys if balances.get(k, 0) > once),
        },
    )
    assert completed == len(keys)
    if handler == "ledger_steps":
        _check_steps(effects, records)
    return balances, counts, statements


def _check_steps(effects: Path, records: dict[str, Any]) -> None:
    """Each step's last call is the one its record names: none ran again after it."""
    last: dict[tuple[str, str], str] = {}
    for line in effects.read_text().splitlines():
        _, key_step, attempt_id, _, run_id = line.split()
        last[run_id, key_step.rpartition("/")[2]] = attempt_id
    for run_id, record in records.items():
        recorded = steps.steps_of(record)
        assert list(recorded) == [f"step-{i}" for i in range(STEPS)], run_id
        for name, step in recorded.items():
            assert last[run_id, name] == step.attempt_id, (run_id, name)


def test_a_transactional_effect_is_applied_exactly_once_under_sigkills(
    tmp_path: Path, ledger_backend: Backend, report: Callable[[str, Tally], None]
) -> None:
    balances, counts, _ = _run(tmp_path, ledger_backend, "ledger_tx")
    report(f"crash_after_effect[{ledger_backend.name}, transactional]", counts)
    assert counts.lost == 0
    assert set(balances.values()) == {1}, "a balance other than 1: not exactly once"
    assert counts.extra["kills"] > 0
    if FULL:  # The scenario must have killed some attempts after their effect ran.
        assert counts.extra["effect_reruns"] > 0


@pytest.mark.skipif(not FULL, reason="the control shows double application at full scale only")
def test_the_same_effect_without_transactional_is_applied_twice_under_the_same_kills(
    tmp_path: Path, ledger_backend: Backend, report: Callable[[str, Tally], None]
) -> None:
    _, counts, _ = _run(tmp_path, ledger_backend, "ledger_plain")
    report(f"crash_after_effect[{ledger_backend.name}, control]", counts)
    assert counts.lost == 0  # At least once: every task's effect is there.
    if FULL:
        assert counts.extra["applied_twice_or_more"] >= 1, "the control never double-applied"


def test_transactional_steps_are_each_applied_exactly_once_under_sigkills(
    tmp_path: Path, ledger_backend: Backend, report: Callable[[str, Tally], None]
) -> None:
    if not FULL and ledger_backend.name != "sqlite":
        pytest.skip("on SQLite only outside the full suite (make faults)")
    balances, counts, _ = _run(tmp_path, ledger_backend, "ledger_steps")
    report(f"crash_after_effect[{ledger_backend.name}, transactional steps]", counts)
    assert set(balances.values()) == {STEPS}, "a balance other than 3: a step not exactly once"
    assert counts.extra["kills"] > 0
    if FULL:  # The scenario must have killed some attempts after a step's effect ran.
        assert counts.extra["effect_reruns"] > 0
