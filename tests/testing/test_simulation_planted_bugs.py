"""Planted bugs the simulation's checker must find: each test breaks one rule of the real
store or of the claim rules (a subclass of a store, or a rule of
:mod:`tasklease.worker.core.decisions` / :mod:`tasklease.worker.core.locking` patched for the
test), runs a stated seed for a stated number of lifecycles, and asserts that the checker
names the invariant it breaks, with a replay command, and that the same run without the
plant is clean. A checker that never finds a planted bug proves nothing."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tasklease.testing.simulation import WORKLOAD_KINDS, FaultPlan, SimulationReport, simulate
from tasklease.testing.simulation.replay import replay_command
from tasklease.worker.core import decisions, locking
from tasklease.worker.core.records import (
    Claim,
    ClaimRequest,
    LockRecord,
    RunRecord,
    RunStatus,
    Verdict,
)
from tasklease.worker.stores import MemoryStore
from tasklease.worker.stores.base.store import LeaseStore, Moment, resolve
from tasklease.worker.stores.base.transactional import TransactionOutcome, Work
from tasklease.worker.stores.sqlite import schema
from tasklease.worker.stores.sqlite.store import SqliteStore
from tasklease.worker.stores.sqlite.transactions import run_transaction

StoreFactory = Callable[[], LeaseStore]
# The workload kinds these seeds were found with. A kind added since (fan_in, waits, cancel)
# makes every run of the default workload draw other lifecycles; these plants keep the runs they
# were found in.
KINDS = tuple(kind for kind in WORKLOAD_KINDS if kind not in ("fan_in", "waits", "cancel"))


def sqlite_stores(directory: Path, store_class: type[SqliteStore] = SqliteStore) -> StoreFactory:
    """Fresh SQLite stores of ``store_class``, each in a file of its own under ``directory``."""
    numbers = itertools.count(1)

    def fresh() -> LeaseStore:
        return store_class(directory / f"simulation-{next(numbers)}.db")

    return fresh


@functools.cache
def memory_run(seed: int, lifecycles: int) -> SimulationReport:
    """The unplanted memory run of ``seed`` (shared by the plants that use the same one)."""
    return simulate(
        MemoryStore, seed=seed, lifecycles=lifecycles, workload=KINDS, store_name="memory"
    )


def planted_run(
    factory: StoreFactory, store: str, seed: int, lifecycles: int, plan: FaultPlan | None = None
) -> SimulationReport:
    return simulate(
        factory, seed=seed, lifecycles=lifecycles, faults=plan, workload=KINDS, store_name=store
    )


def assert_caught(
    report: SimulationReport,
    invariant: str,
    store: str,
    seed: int,
    lifecycles: int,
    plan: FaultPlan | None = None,
) -> None:
    """``report`` found ``invariant`` broken, and its text names the run's replay command."""
    named = [
        text
        for found, text in zip(report.found, report.violations, strict=True)
        if found.invariant == invariant
    ]
    assert named, f"{invariant} not found; found: {sorted({v.invariant for v in report.found})}"
    command = replay_command(store, seed, lifecycles, plan or FaultPlan(), KINDS)
    assert named[0].startswith(invariant) and named[0].endswith(f"replay: {command}"), named[0]


def assert_clean(report: SimulationReport) -> None:
    assert report.violations == (), report.violations[:3]
    assert sum(report.faults.values()) > 0  # A clean run that met faults, not a calm one.


# --- the plants ---------------------------------------------------------------------------


def test_a_claim_granted_while_another_attempt_holds_its_lease_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(a) The claim rule takes every in-progress lease for expired: a second attempt runs
    beside the holder."""
    seed, lifecycles = 1, 200
    monkeypatch.setattr(decisions, "lease_held", lambda record, now: False)

    report = planted_run(MemoryStore, "memory", seed, lifecycles)

    assert_caught(report, "holders_interleave", "memory", seed, lifecycles)
    monkeypatch.undo()
    assert_clean(memory_run(seed, lifecycles))


class StaleFinishStore(MemoryStore):
    """(b) A completion that checks only that the run is in progress, not which attempt
    holds it: a stale attempt's finish lands on its successor's claim."""

    def complete(
        self,
        run_id: str,
        attempt_id: str,
        result_json: str | None,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> bool:
        def change(record: RunRecord | None) -> tuple[RunRecord | None, bool]:
            if record is None or record.status is not RunStatus.IN_PROGRESS:
                return None, decisions.finished_by(record, attempt_id, RunStatus.COMPLETED)
            at = resolve(now)
            written = decisions.completed(record.replace(attempt_id=attempt_id), result_json, at)
            return decisions.kept(written, at, keep_for), True

        return self._read_modify_write(run_id, change)


# Faults concentrated on the threat of a stale attempt: store requests held up on their way
# past the lease, stalls, and the redeliveries (a duplicate, a deadline shorter than the work)
# that let a successor take a run over meanwhile.
HELD_UP = FaultPlan().with_rates(
    {"slow_request": 0.25, "duplicate": 0.3, "dispatch_deadline": 0.3, "stall": 0.02}
)


@functools.cache
def held_up_run(seed: int, lifecycles: int) -> SimulationReport:
    """The unplanted memory run of ``seed`` under :data:`HELD_UP`."""
    return planted_run(MemoryStore, "memory", seed, lifecycles, HELD_UP)


def test_a_stale_attempts_finish_that_lands_is_found() -> None:
    """(b) An attempt's completion held up on its way past its lease lands on the claim of
    the attempt that took the run over: the successor's own completion is refused while its
    lease holds."""
    seed, lifecycles = 3, 400

    report = planted_run(StaleFinishStore, "memory", seed, lifecycles, HELD_UP)

    assert_caught(report, "refused_while_holding", "memory", seed, lifecycles, HELD_UP)
    assert_clean(held_up_run(seed, lifecycles))


def test_a_fencing_token_that_does_not_grow_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """(c) A claim hands out the token the record already had (1 for a new run) instead of
    the next one: a takeover's attempt presents its predecessor's token."""
    seed, lifecycles = 1, 30
    grant = decisions.claim

    def claim_without_new_token(
        record: RunRecord | None, request: ClaimRequest, now: datetime
    ) -> Claim:
        outcome = grant(record, request, now)
        if outcome.verdict is not Verdict.CLAIMED:
            return outcome
        token = max(record.fencing_token if record is not None else 0, 1)
        return dataclasses.replace(outcome, record=outcome.record.replace(fencing_token=token))

    monkeypatch.setattr(decisions, "claim", claim_without_new_token)

    report = planted_run(MemoryStore, "memory", seed, lifecycles)

    assert_caught(report, "token_reused", "memory", seed, lifecycles)
    monkeypatch.undo()
    assert_clean(memory_run(seed, lifecycles))


class SplitCompletionStore(SqliteStore):
    """(d) A transactional completion committed outside the handler's transaction: the
    handler's writes commit in one store call, the completion record in a second one after
    it. An instance killed between them (or a second call that fails) leaves the effect
    committed and the run in progress, and the retry that takes it over commits it again.

    ``complete_in_transaction`` is a property so that the simulation's store faults, which
    wrap each public method of the store as one call, leave it unwrapped: the two calls it
    makes are each a call of their own, with the pauses and faults between them."""

    def commit_handler_work(self, run_id: str, attempt_id: str, work: Work) -> TransactionOutcome:
        """``work``'s writes alone, committed if ``attempt_id`` holds the claim."""
        database = self._database

        def holds(connection: Any, _: str | None) -> bool:
            row = schema.read_row(connection, run_id)
            return row is not None and decisions.holds(schema.decode_run(row), attempt_id)

        def committed() -> tuple[bool, str | None]:
            with database.guard("run a transaction"):
                return run_transaction(database.writing(), work, holds, database.writer)

        held, result_json = database.alone(committed)
        return TransactionOutcome(held=held, result_json=result_json if held else None)

    @property
    def complete_in_transaction(self) -> Callable[..., TransactionOutcome]:
        def in_two_commits(
            run_id: str,
            attempt_id: str,
            work: Work,
            now: Moment,
            *,
            keep_for: timedelta | None = None,
        ) -> TransactionOutcome:
            first = self.commit_handler_work(run_id, attempt_id, work)
            if not first.held:
                return first
            done = self.complete(run_id, attempt_id, first.result_json, now, keep_for=keep_for)
            return TransactionOutcome(held=done, result_json=first.result_json if done else None)

        return in_two_commits


def test_a_completion_committed_apart_from_the_handlers_transaction_is_found(
    tmp_path: Path,
) -> None:
    """(d) SQLite: the memory store has no transactions."""
    seed, lifecycles = 3, 60

    report = planted_run(sqlite_stores(tmp_path, SplitCompletionStore), "sqlite", seed, lifecycles)

    assert_caught(report, "ledger_twice", "sqlite", seed, lifecycles)
    assert_clean(planted_run(sqlite_stores(tmp_path / "clean"), "sqlite", seed, lifecycles))


def test_a_lock_granted_while_another_run_holds_it_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(e) The lock rule never finds a lock busy: two runs of one exclusive job or one
    concurrency key hold it together."""
    seed, lifecycles = 2, 200

    def never_busy(
        lock: LockRecord | None, run_id: str, now: datetime, holder_run: RunRecord | None = None
    ) -> datetime | None:
        return None

    monkeypatch.setattr(locking, "busy_until", never_busy)

    report = planted_run(MemoryStore, "memory", seed, lifecycles)

    assert_caught(report, "holders_interleave", "memory", seed, lifecycles)
    monkeypatch.undo()
    assert_clean(memory_run(seed, lifecycles))


def test_a_completed_run_claimed_again_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """(f) The claim rule ignores the completion record: a duplicate of a finished run runs
    its handler again."""
    seed, lifecycles = 2, 200
    decide = decisions.decide

    def decide_ignoring_completion(
        record: RunRecord | None, now: datetime, caller: str | None = None
    ) -> Verdict:
        verdict = decide(record, now, caller)
        return Verdict.CLAIMED if verdict is Verdict.COMPLETED else verdict

    monkeypatch.setattr(decisions, "decide", decide_ignoring_completion)

    report = planted_run(MemoryStore, "memory", seed, lifecycles)

    assert_caught(report, "write_after_acknowledged", "memory", seed, lifecycles)
    monkeypatch.undo()
    assert_clean(memory_run(seed, lifecycles))


def test_a_lost_answer_not_recognised_as_its_own_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(h) A finish retried after its commit's answer was lost no longer recognises its own
    landed write: the attempt answers lost_claim while its lease holds, and the queue runs
    the handler again."""
    seed, lifecycles = 3, 100
    clean = memory_run(seed, lifecycles)
    monkeypatch.setattr(decisions, "finished_by", lambda record, attempt_id, status: False)

    report = planted_run(MemoryStore, "memory", seed, lifecycles)

    assert_caught(report, "refused_while_holding", "memory", seed, lifecycles)
    assert_clean(clean)


class StaleRenewalStore(MemoryStore):
    """(g) A renewal that checks only that the run is in progress, not which attempt holds
    it: a stale attempt is told its lease runs on, and extends its successor's."""

    def renew_run(
        self,
        run_id: str,
        attempt_id: str,
        lease: timedelta,
        now: Moment,
        *,
        keep_for: timedelta | None = None,
    ) -> RunRecord | None:
        def change(record: RunRecord | None) -> tuple[RunRecord | None, RunRecord | None]:
            if record is None or record.status is not RunStatus.IN_PROGRESS:
                return None, None
            written = decisions.renewed(record, resolve(now) + lease, keep_for)
            return written, written

        return self._read_modify_write(run_id, change)


def test_a_renewal_granted_to_an_attempt_no_longer_holding_is_found() -> None:
    """(g) A renewal held up on its way lands after a takeover and is granted: the stale
    attempt, told its lease runs on, carries on as if it held the run, and is refused its
    completion while its own clock says its lease holds."""
    seed, lifecycles = 81, 400

    report = planted_run(StaleRenewalStore, "memory", seed, lifecycles, HELD_UP)

    assert_caught(report, "refused_while_holding", "memory", seed, lifecycles, HELD_UP)
    assert_clean(held_up_run(seed, lifecycles))


def test_a_lock_taken_back_by_an_attempt_whose_claim_passed_on_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(i) A concurrency key's lock granted to an attempt of the run whose claim has passed
    to a later attempt (its request held up past its lease): it takes the lock from that
    attempt and, giving it back, leaves it answering lost_claim while its lease holds."""
    seed, lifecycles = 8, 400
    clean = held_up_run(seed, lifecycles)
    monkeypatch.setattr(locking, "claim_passed_on", lambda lock, request, run: False)

    report = planted_run(MemoryStore, "memory", seed, lifecycles, HELD_UP)

    assert_caught(report, "refused_while_holding", "memory", seed, lifecycles, HELD_UP)
    assert_clean(clean)
