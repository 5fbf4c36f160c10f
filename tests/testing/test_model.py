"""The bounded model of the protocol: the real rules break no invariant within the stated
bounds, and each bug planted in the rules is found, with a trace that shows how."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from tasklease.testing.model import (
    Bounds,
    Completion,
    Effect,
    Holder,
    ModelReport,
    Rules,
    effect_repeated_after_completion,
    explore,
    holders_overlap,
    main,
)
from tasklease.worker.core import decisions, locking
from tasklease.worker.core.constants import MAX_CLOCK_SKEW
from tasklease.worker.core.records import (
    Claim,
    ClaimRequest,
    LockGrant,
    LockRecord,
    LockRequest,
    RunRecord,
    RunStatus,
)
from tests.support.fresh_python import run_python

# Two attempts of one run of an exclusive job: the second takes the lock over.
LOCK_BOUNDS = Bounds(attempts=2, lock=True, horizon=timedelta(seconds=4))

# What the real rules give, stated in docs/guarantees.md ("A bounded model of the protocol").
EXPLORED = {
    "three attempts, plain effect": (Bounds(), 99245),
    "three attempts, transactional effect": (Bounds(transactional=True), 4945),
    "two attempts holding a lock": (LOCK_BOUNDS, 74434),
    "two attempts, crashes as steps": (Bounds(attempts=2, crashes=True), 19496),
}


def reported(report: ModelReport, record_property: Callable[[str, object], None]) -> None:
    print(report.summary())  # In the test's output with -s or -rA.
    record_property("states", report.states)
    record_property("transitions", report.transitions)


@pytest.mark.parametrize("name", EXPLORED)
def test_the_real_rules_break_no_invariant_within_the_bounds(
    name: str, record_property: Callable[[str, object], None]
) -> None:
    bounds, states = EXPLORED[name]
    report = explore(bounds)
    reported(report, record_property)
    assert report.violations == (), str(report)
    assert report.states == states, report.summary()
    assert report.transitions > report.states
    assert report.max_depth > 10


def found(report: ModelReport, invariant: str) -> str:
    """The violation of ``invariant`` the report holds, printed with its trace."""
    matching = [v for v in report.violations if v.invariant == invariant]
    assert matching, str(report)
    text = str(matching[0])
    assert len(matching[0].trace) >= 2, text
    return text


def claim_while_held(record: RunRecord | None, request: ClaimRequest, now: datetime) -> Claim:
    """A claim that takes a run over although its lease is live."""
    if record is not None and record.status is RunStatus.IN_PROGRESS:
        record = record.replace(lease_expires=now - MAX_CLOCK_SKEW)
    return decisions.claim(record, request, now)


def test_a_claim_granted_while_the_lease_is_held_is_found() -> None:
    report = explore(Bounds(attempts=2), Rules(claim=claim_while_held), stop_at_violation=True)
    text = found(report, "holders overlap")
    assert "a0 and a1 both hold the lease of run0" in text
    assert "a1 is delivered and claims: claimed, token 2" in text


def test_a_finish_that_ignores_the_attempt_id_is_found() -> None:
    def any_holder(record: RunRecord | None, attempt_id: str) -> bool:
        return record is not None and record.status is RunStatus.IN_PROGRESS

    report = explore(Bounds(attempts=2), Rules(holds=any_holder), stop_at_violation=True)
    text = found(report, "finish without the claim")
    assert "a0's finish was accepted over a1 in_progress" in text


def test_a_fencing_token_that_resets_is_found() -> None:
    def reset(lock: LockRecord | None, now: datetime) -> int:
        return 1

    report = explore(LOCK_BOUNDS, Rules(next_token=reset), stop_at_violation=True)
    text = found(report, "fencing token did not grow")
    assert "token 1 granted after token 1" in text


def test_a_lock_granted_while_another_run_holds_it_is_found() -> None:
    """Two runs of an exclusive job, one attempt each."""

    def ignore_the_holder(
        lock: LockRecord | None, request: LockRequest, now: datetime, holder: RunRecord | None
    ) -> LockGrant:
        return locking.acquire(None, request, now)

    bounds = Bounds(attempts=2, runs=2, lock=True, horizon=timedelta(seconds=3))
    report = explore(bounds, Rules(acquire=ignore_the_holder), stop_at_violation=True)
    text = found(report, "holders overlap")
    assert "a0 and a1 both hold the lock" in text


def test_a_lock_taken_back_by_an_attempt_whose_claim_passed_on_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runs of one concurrency key, the first delivered twice: its stale attempt takes
    the lock from its successor, gives it back, and the other run takes it meanwhile."""
    monkeypatch.setattr(locking, "claim_passed_on", lambda lock, request, run: False)
    short = timedelta(seconds=2)
    bounds = Bounds(attempts=3, runs=2, lock=True, lease=short, horizon=short, retention=short)
    report = explore(bounds, Rules(), stop_at_violation=True)
    text = found(report, "holders overlap")
    assert "a1 and a2 both hold the lock" in text
    assert "a0 takes the lock" in text and "a0 releases the lock" in text


def test_a_renewal_that_extends_a_lapsed_lease_is_found() -> None:
    """The renewal was sent in time and lands after another attempt took the run over."""

    def any_holder(record: RunRecord | None, attempt_id: str) -> bool:
        return record is not None and record.status is RunStatus.IN_PROGRESS

    report = explore(Bounds(attempts=2), Rules(renewable=any_holder), stop_at_violation=True)
    text = found(report, "holders overlap")
    assert "a0 renews its lease: sent" in text
    assert "a0's renewal lands: renewed" in text


def test_clocks_further_apart_than_the_skew_allowance_break_the_lease() -> None:
    """The guarantee holds for clocks within MAX_CLOCK_SKEW, and the model sees it fail
    beyond: an instance two seconds ahead takes over a lease its holder still runs."""
    report = explore(Bounds(attempts=2, skew=2 * MAX_CLOCK_SKEW), stop_at_violation=True)
    text = found(report, "holders overlap")
    assert "(clock +2s) is delivered and claims: claimed" in text


def test_the_invariants_read_plain_facts() -> None:
    """A history checker applies them to what it recorded, without the model."""
    assert holders_overlap([Holder("a0", "r", False), Holder("a1", "s", False)]) is None
    assert holders_overlap([Holder("a0", "r", True), Holder("a1", "s", True)]) is not None
    done = datetime(2030, 1, 1, 0, 0, 10)
    again = Effect("a1", "r", 12, done + timedelta(seconds=2), 2, None, committed=True)
    retention = timedelta(seconds=4)
    message = effect_repeated_after_completion(again, [Completion("a0", "r", done)], retention)
    assert message is not None and "a1 ran the effect again" in message
    later = Effect("a1", "r", 15, done + retention + MAX_CLOCK_SKEW, 2, None, committed=True)
    assert effect_repeated_after_completion(later, [Completion("a0", "r", done)], retention) is None


@pytest.mark.parametrize(
    ("changes", "fix"),
    [
        ({"attempts": 5}, "give 1 to 4"),
        ({"attempts": 1, "runs": 2}, "give 1, or 2 with at least 2 attempts"),
        ({"attempts": 2, "runs": 2}, "give lock=True"),
        ({"lease": timedelta(0)}, "the lease must be positive"),
        ({"horizon": timedelta(seconds=1)}, "a horizon of at least one lease"),
    ],
)
def test_bounds_out_of_range_say_what_to_give(changes: dict[str, object], fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        Bounds(**changes)  # type: ignore[arg-type]


def test_the_module_prints_one_summary_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--attempts", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    assert lines[0].endswith("tick 1s)")
    assert ", 0 violations (1 attempts of 1 run(s), plain effect, lease 3s" in lines[0]


def test_the_module_runs_as_a_program_and_refuses_bad_bounds() -> None:
    result = run_python(
        "import sys, runpy; sys.argv = ['model', '--attempts', '9']; "
        "runpy.run_module('tasklease.testing.model', run_name='__main__')"
    )
    assert result.returncode == 2
    assert "attempts=9: give 1 to 4" in result.stderr
