"""The waits workload (a durable step, ``ctx.wait_for`` with a seeded timeout or none, and a
user who signals the run zero, one or two times): it runs clean on memory and SQLite, the same
twice, and its invariants catch the bugs planted for them (by monkeypatching tasklease, never
editing it) within a stated number of lifecycles of a stated seed, whose unplanted run is
clean."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease.testing.simulation import SimulationReport, simulate
from tasklease.testing.simulation.stores import store_factory
from tasklease.worker.core import decisions
from tasklease.worker.core import waits as rules
from tasklease.worker.core.records import RunRecord
from tasklease.worker.core.waits import SignalDecision, Signalled, Wait, Waits
from tasklease.worker.operate import signals
from tasklease.worker.stores.memory.store import MemoryStore

SEED, LIFECYCLES = 1, 60  # Every plant is caught here; each seed of 1-5 catches them too.


def _memory(seed: int = SEED, lifecycles: int = LIFECYCLES) -> SimulationReport:
    return simulate(
        MemoryStore, seed=seed, lifecycles=lifecycles, workload=["waits"], store_name="memory"
    )


def _invariants(report: SimulationReport) -> set[str]:
    return {violation.invariant for violation in report.found}


def test_the_waits_workload_runs_clean_and_the_same_twice_on_memory() -> None:
    report, again = _memory(), _memory()

    assert report.violations == (), report.violations[:3]
    assert sum(report.faults.values()) > 0
    assert again.trace_hash == report.trace_hash


def test_the_waits_workload_runs_clean_on_sqlite(tmp_path: Path) -> None:
    report = simulate(
        store_factory("sqlite", tmp_path),
        seed=SEED,
        lifecycles=LIFECYCLES,
        workload=["waits"],
        store_name="sqlite",
    )

    assert report.violations == (), report.violations[:3]
    assert sum(report.faults.values()) > 0


def test_a_suspension_that_landed_unheard_is_not_answered_lost_claim() -> None:
    # The run that found it: the suspension's write landed, its answer was lost, the signal's
    # resume claimed the run, and the suspension's retry was answered 409 lost_claim while its
    # lease held (refused_while_holding).
    report = _memory(seed=4, lifecycles=47)

    assert report.violations == (), report.violations[:3]


def overwriting(
    record: RunRecord | None,
    name: str,
    payload_json: str,
    now: datetime,
    *,
    live: bool,
    room: int | None = None,
) -> tuple[RunRecord | None, SignalDecision]:
    """The bug: a signal sent again while the first is pending records its payload over
    the first's, and the run resumes with the duplicate's."""
    state = rules.waits_of(record)
    if record is None or not live or record.status in rules.ENDED or name not in state.signals:
        return signalled(record, name, payload_json, now, live=live, room=room)
    pending = {**state.signals, name: rules.Signal(payload_json, now)}
    kept = Waits(state.wait, pending, state.delivered, state.suspended)
    written = record.replace(waits_json=rules.encode(kept))
    due = rules.signal_due(written)
    return written, SignalDecision(Signalled.RESUMES if due else Signalled.KEPT, written, due)


signalled = rules.signalled


def test_a_second_signal_recorded_over_the_first_is_resumed_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clean = _memory()
    monkeypatch.setattr(rules, "signalled", overwriting)
    planted = _memory()

    assert clean.violations == (), clean.violations[:3]
    assert _invariants(planted) == {"resumed_twice"}, planted.violations[:3]
    assert planted.violations[0].endswith(
        f"replay: tasklease simulate --store memory --seed {SEED} --lifecycles {LIFECYCLES} "
        "--workload waits"
    )


def test_a_timeout_recorded_in_milliseconds_resumes_unsignalled_before_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clean = _memory()
    suspended = rules.suspended

    def in_milliseconds(record: RunRecord, wait: Wait) -> str | None:
        # The bug: the deadline the record keeps counts the timeout in milliseconds.
        if wait.deadline is not None:
            wait = dataclasses.replace(
                wait, deadline=wait.since + (wait.deadline - wait.since) / 1000
            )
        return suspended(record, wait)

    monkeypatch.setattr(rules, "suspended", in_milliseconds)
    planted = _memory()

    assert clean.violations == (), clean.violations[:3]
    assert _invariants(planted) == {"resumed_unsignalled"}, planted.violations[:3]
    assert "before it was due" in planted.violations[0]


def test_a_suspension_that_drops_the_runs_steps_reruns_its_pre_wait_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clean = _memory()
    waiting = decisions.waiting

    def stepless(
        record: RunRecord,
        wait: Wait | None,
        payload: str | None,
        now: datetime,
        keep_for: timedelta | None = None,
    ) -> RunRecord:
        # The bug: the waiting record keeps no steps, so the resumed delivery runs them again.
        return waiting(record.replace(steps_json=None), wait, payload, now, keep_for)

    monkeypatch.setattr(decisions, "waiting", stepless)
    planted = _memory()

    assert clean.violations == (), clean.violations[:3]
    assert "resumed_unsignalled" in _invariants(planted), planted.violations[:3]
    assert any("ran the step asked" in text for text in planted.violations)


def test_a_signal_that_records_but_never_enqueues_the_resume_is_a_lost_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clean = _memory()

    def enqueue_nothing(*args: Any, **kwargs: Any) -> None:
        """The bug: the signal is recorded, and its resume task never created."""

    monkeypatch.setattr(signals, "enqueue_resume", enqueue_nothing)
    planted = _memory()

    assert clean.violations == (), clean.violations[:3]
    assert _invariants(planted) == {"lost_resume"}, planted.violations[:3]


def test_a_write_after_a_waking_tasks_early_200_is_no_write_after_the_runs_end() -> None:
    """A timeout task come for an earlier deadline than the one recorded is answered 200 with
    nothing run (it asks for the task due then); its duplicate, past the deadline, may resume
    the run. Its write is no write after the run's end; one after the run's end is."""
    from tasklease.testing.simulation.checker import check  # noqa: PLC0415
    from tasklease.testing.simulation.history import (  # noqa: PLC0415
        Answer,
        History,
        Origin,
        Suspended,
        Write,
    )

    run = "r" * 64
    history = History(seed=1, store="memory")
    history.origins["task:own"] = Origin("task:own", "task", "waiter", acknowledged_at=1.0)
    history.origins["task:own"].run = run
    early = Origin("task:t1", "task", "waiter", acknowledged_at=20.0)
    early.run, early.wakes = run, "timeout"
    history.origins["task:t1"] = early
    history.waiters["w1"] = run
    history.suspensions.append(Suspended(0.5, "task:own", run, "a1", 60.0))
    key = "k"

    def write(at: float, origin: str, attempt: str, step: int, *, final: bool) -> Write:
        return Write(at, origin, f"run:{run}", attempt, 1, key, step, final, True, True)

    history.writes += [write(0.4, "task:own", "a1", 0, final=False)]
    history.answers += [Answer(1.0, "task:own", 200), Answer(20.0, "task:t1", 200)]
    history.writes.append(write(70.0, "task:t1", "a2", 1, final=True))  # Its duplicate resumed.
    history.answers.append(Answer(71.0, "task:t1", 200))
    after = [v for v in check(history) if v.invariant == "write_after_acknowledged"]
    assert after == []
    history.writes.append(write(80.0, "task:t1", "a3", 1, final=True))  # After the end.
    after = [v for v in check(history) if v.invariant == "write_after_acknowledged"]
    assert [v.at for v in after] == [80.0]
