"""The pure rules of durable waits: the record's waits, signals, resolutions and headers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tasklease.worker.core import decisions, steps, waits
from tasklease.worker.core.records import ClaimRequest, RunRecord, RunStatus, Verdict
from tasklease.worker.core.waits import Signalled, Wait

T0 = datetime(2026, 12, 4, 12, tzinfo=UTC)
RUN = "a" * 64


def record(status: RunStatus = RunStatus.IN_PROGRESS, **changes: object) -> RunRecord:
    base = RunRecord(
        run_id=RUN,
        kind="task",
        handler="approve",
        status=status,
        attempt_id="attempt-1",
        fencing_token=1,
        attempts=1,
        lease_expires=T0 + timedelta(minutes=5),
        expire_at=T0 + timedelta(days=7),
        claimed_at=T0,
        identity={"queue": "q", "task_name": "t"},
    )
    return base.replace(**changes)


def waiting_on(
    name: str = "approval", deadline: datetime | None = T0 + timedelta(hours=1)
) -> RunRecord:
    wait = Wait(name, 0, T0, deadline, queue="q")
    return decisions.waiting(record(), wait, '{"order":7}', T0, timedelta(days=7))


def test_a_waiting_record_keeps_its_steps_payload_and_is_kept_past_its_deadline() -> None:
    step = steps.StepRecord("ask", "1", "attempt-1", T0, 1)
    asked = steps.with_step(record(), step)
    wait = Wait("approval", 0, T0, T0 + timedelta(days=20))
    held = decisions.waiting(asked, wait, "{}", T0, timedelta(days=7))
    assert held.status is RunStatus.WAITING and held.attempts == 0
    assert held.steps_json == asked.steps_json and held.payload == "{}"
    assert held.expire_at >= T0 + timedelta(days=27)
    assert waits.waits_of(held).wait == wait


def test_a_wait_recorded_again_keeps_its_first_deadline() -> None:
    first = waiting_on(deadline=T0 + timedelta(hours=1))
    again = Wait("approval", 0, T0 + timedelta(minutes=30), T0 + timedelta(hours=2))
    kept = decisions.waiting(first, again, None, T0 + timedelta(minutes=30))
    wait = waits.waits_of(kept).wait
    assert wait is not None and wait.deadline == T0 + timedelta(hours=1) and wait.since == T0


def test_decide_holds_a_waiting_run_until_its_signal_or_deadline() -> None:
    held = waiting_on()
    assert decisions.decide(held, T0 + timedelta(minutes=59)) is Verdict.WAITING
    assert decisions.decide(held, T0 + timedelta(hours=1)) is Verdict.CLAIMED
    signalled, decision = waits.signalled(held, "approval", "true", T0, live=True)
    assert decision.outcome is Signalled.RESUMES and decision.resume is not None
    assert signalled is not None
    assert decisions.decide(signalled, T0 + timedelta(seconds=1)) is Verdict.CLAIMED
    other, decision = waits.signalled(held, "other", "1", T0, live=True)
    assert decision.outcome is Signalled.KEPT and decision.resume is None
    assert other is not None and decisions.decide(other, T0) is Verdict.WAITING


def test_a_claim_of_a_resumable_run_carries_its_waits_payload_and_identity() -> None:
    signalled, _ = waits.signalled(waiting_on(), "approval", "true", T0, live=True)
    assert signalled is not None
    request = ClaimRequest(
        RUN, "task", "approve", "attempt-2", timedelta(minutes=5), timedelta(days=7),
        identity={"queue": "q", "task_name": "resume-task"},
    )  # fmt: skip
    claim = decisions.claim(signalled, request, T0 + timedelta(seconds=1))
    assert claim.verdict is Verdict.CLAIMED
    assert claim.record.waits_json == signalled.waits_json
    assert claim.record.payload == '{"order":7}'
    assert claim.record.identity["task_name"] == "t"


@pytest.mark.parametrize(
    ("before", "outcome"),
    [
        (None, Signalled.MISSING),
        (record(RunStatus.COMPLETED), Signalled.ENDED),
        (record(RunStatus.CANCELLED), Signalled.ENDED),
        (record(cancelled_at=T0, cancelled_by="ops"), Signalled.ENDED),
    ],
)
def test_a_signal_to_no_run_or_an_ended_one_writes_nothing(
    before: RunRecord | None, outcome: Signalled
) -> None:
    written, decision = waits.signalled(before, "approval", "1", T0, live=before is not None)
    assert written is None and decision.outcome is outcome and not outcome.accepted


def test_a_signal_sent_twice_is_a_duplicate_that_asks_for_the_same_resume() -> None:
    once, first = waits.signalled(waiting_on(), "approval", '"yes"', T0, live=True)
    assert once is not None and first.outcome is Signalled.RESUMES
    twice, second = waits.signalled(once, "approval", '"no"', T0, live=True)
    assert twice is None and second.outcome is Signalled.DUPLICATE and second.outcome.accepted
    assert second.resume == first.resume
    assert waits.waits_of(once).signals["approval"].payload_json == '"yes"'


def test_resolution_takes_the_signal_before_a_due_timeout_and_once() -> None:
    signalled, _ = waits.signalled(waiting_on(), "approval", '"yes"', T0, live=True)
    assert signalled is not None
    outcome = waits.resolved(signalled, "approval", 0, "attempt-2", T0 + timedelta(hours=2))
    assert outcome is not None
    resolved, step = outcome
    assert step.name == "wait:approval" and step.result == {"signal": "yes"}
    state = waits.waits_of(resolved)
    assert state.wait is None and state.signals == {} and state.delivered == {"approval": "signal"}
    _, late = waits.signalled(resolved, "approval", '"again"', T0, live=True)
    assert late.outcome is Signalled.DUPLICATE and late.resume is None


def test_a_record_shows_a_suspension_while_it_waits_and_once_resolved_never_before() -> None:
    wait = Wait("approval", 0, T0, T0 + timedelta(hours=1), queue="q")
    waiting = waiting_on()
    signalled, _ = waits.signalled(waiting, "approval", '"yes"', T0, live=True)
    assert signalled is not None
    outcome = waits.resolved(signalled, "approval", 0, "attempt-2", T0)
    assert outcome is not None
    assert waits.suspension_landed(waiting, wait)
    assert waits.suspension_landed(outcome[0], wait)  # Resolved by the delivery that resumed it.
    assert not waits.suspension_landed(record(), wait)  # Never suspended.
    assert not waits.suspension_landed(None, wait)
    assert not waits.suspension_landed(waiting, Wait("approval", 1, T0))  # Another delivery's.


def test_resolution_by_timeout_only_once_due_and_a_later_signal_is_refused() -> None:
    held = waiting_on()
    assert waits.resolved(held, "approval", 0, "attempt-2", T0 + timedelta(minutes=59)) is None
    outcome = waits.resolved(held, "approval", 0, "attempt-2", T0 + timedelta(hours=1))
    assert outcome is not None
    resolved, step = outcome
    assert step.result == {"timed_out": "2026-12-04T13:00:00.000000Z"}
    written, late = waits.signalled(resolved, "approval", "1", T0, live=True)
    assert written is None and late.outcome is Signalled.TIMED_OUT and not late.outcome.accepted


def test_pending_signals_are_capped_with_the_runs_steps() -> None:
    big = '"' + "x" * (steps.MAX_RUN_STEP_BYTES - 100) + '"'
    with pytest.raises(waits.SignalError, match="per-run cap"):
        waits.signalled(waiting_on(), "approval", big, T0, live=True)
    with pytest.raises(waits.SignalError, match="store it elsewhere"):
        waits.encode_payload("x" * waits.MAX_SIGNAL_PAYLOAD_BYTES)
    with pytest.raises(waits.SignalError, match="not JSON"):
        waits.encode_payload({1, 2})


def test_resume_headers_round_trip_and_refuse_what_is_not_one() -> None:
    wait = Wait("a name/with: colons", 3, T0, T0 + timedelta(hours=1))
    header = waits.resume_header(RUN, wait, timeout=True)
    due = int((T0 + timedelta(hours=1)).timestamp()) * 1_000_000
    resume = waits.parse_resume_header(header)
    assert resume == waits.Resume(RUN, 3, wait.name, True, due) and resume.for_deadline(wait)
    signal = waits.parse_resume_header(waits.resume_header(RUN, wait, timeout=False))
    assert signal == waits.Resume(RUN, 3, wait.name, False)
    for bad in ("", f"{RUN}:3:signal", f"{RUN[:-1]}:3:signal:x", f"{RUN}:-1:signal:x",
                f"{RUN}:3:later:x", f"{RUN}:3:signal:", f"{RUN}:3:timeout:x",
                f"{RUN}:3:timeout@soon:x", f"{RUN}:3:signal@1:x"):  # fmt: skip
        assert waits.parse_resume_header(bad) is None
    assert waits.resume_key(RUN, wait, timeout=True) != waits.resume_key(RUN, wait, timeout=False)


def test_the_operators_summary_names_the_wait_and_never_a_payload() -> None:
    signalled, _ = waits.signalled(waiting_on(), "approval", '"secret"', T0, live=True)
    assert signalled is not None
    shown = waits.summary(signalled)
    assert shown is not None and "secret" not in str(shown)
    assert shown["wait"]["name"] == "approval" and shown["wait"]["signalled"] is True
    assert any("waits for" in line for line in waits.summary_lines(signalled))
    assert waits.summary(record()) is None


def test_a_timeout_the_claim_found_due_is_due_for_the_handler_within_the_clock_skew() -> None:
    held = waiting_on()
    deadline = T0 + timedelta(hours=1)
    assert decisions.decide(held, deadline) is Verdict.CLAIMED  # The store's clock, say.
    # The handler's clock reads up to MAX_CLOCK_SKEW behind: the wait still times out, rather
    # than suspend again and answer the timeout task 200 (which would never resume the run).
    behind = deadline - timedelta(milliseconds=900)
    assert waits.resolved(held, "approval", 0, "attempt-2", behind) is not None
    assert waits.resolved(held, "approval", 0, "attempt-2", deadline - timedelta(seconds=2)) is None
