"""The pure rules of a cancellation (tasklease.worker.core.cancellation): what a cancel writes
for a run in each state, and which runs count as cancelled for their children."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tasklease import protocol
from tasklease.errors import InvalidDelivery
from tasklease.testing.contract_support import EXPIRED, T0, claim_request
from tasklease.worker.core import cancellation, decisions
from tasklease.worker.core.cancellation import CancelOutcome
from tasklease.worker.core.identity import Kind, parse_identity
from tasklease.worker.core.records import RunRecord, RunStatus, Verdict

SECOND = timedelta(seconds=1)


def held() -> RunRecord:
    claim = decisions.claim(None, claim_request(), T0)
    assert claim.verdict is Verdict.CLAIMED
    return claim.record


def test_a_held_run_is_marked_and_ended_by_a_later_cancel_once_its_holder_is_gone() -> None:
    record = held()
    marked, decision = cancellation.cancelled(record, "ops", T0 + SECOND, live=True)
    assert decision.outcome is CancelOutcome.STOPPING and marked is not None
    assert (marked.status, marked.cancelled_by) == (RunStatus.IN_PROGRESS, "ops")
    assert cancellation.is_cancelled(marked)
    assert decisions.decide(marked, T0 + 2 * SECOND) is Verdict.IN_PROGRESS
    again, decision = cancellation.cancelled(marked, "other", T0 + 2 * SECOND, live=True)
    assert (again, decision.outcome) == (None, CancelOutcome.ALREADY)
    lapsed = T0 + SECOND + EXPIRED
    assert decisions.decide(marked, lapsed) is Verdict.CANCELLED
    ended, decision = cancellation.cancelled(marked, "other", lapsed, live=True)
    assert decision.outcome is CancelOutcome.ALREADY and ended is not None
    assert (ended.status, ended.cancelled_by, ended.cancelled_at) == (
        RunStatus.CANCELLED,
        "ops",
        T0 + SECOND,
    )


def test_a_run_that_finished_before_it_saw_the_mark_is_not_cancelled() -> None:
    marked, _ = cancellation.cancelled(held(), "ops", T0 + SECOND, live=True)
    assert marked is not None
    completed = decisions.completed(marked, None, T0 + 2 * SECOND)
    assert not cancellation.is_cancelled(completed)
    written, decision = cancellation.cancelled(completed, "ops", T0 + 3 * SECOND, live=True)
    assert (written, decision.outcome, decision.outcome.accepted) == (
        None,
        CancelOutcome.ENDED,
        False,
    )


def test_a_fan_out_child_named_by_its_own_parent_for_its_cancellation() -> None:
    ended = cancellation.ended_cancelled(held(), T0 + SECOND, cancellation.parent_note("p-1"))
    assert ended.cancelled_by == "the cancellation of its parent run p-1"
    assert ended.error == "cancelled by the cancellation of its parent run p-1"


def test_a_plain_fan_out_childs_identity_names_its_parent_and_refuses_a_bad_one() -> None:
    base = {"X-CloudTasks-QueueName": "q", "X-CloudTasks-TaskName": "t"}

    def parsed(headers: dict[str, str]) -> str | None:
        def lookup(name: str) -> list[str]:
            return [v for k, v in headers.items() if k.lower() == name.lower()]

        return parse_identity(Kind.TASK, "h", lookup, {}).parent

    assert parsed(base) is None
    assert parsed(base | {protocol.PARENT_HEADER: "a" * 64}) == "a" * 64
    with pytest.raises(InvalidDelivery, match="X-Tasklease-Parent header is not valid"):
        parsed(base | {protocol.PARENT_HEADER: "two words"})
