from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tasklease.worker.core import constants as c
from tasklease.worker.core import decisions
from tasklease.worker.core.records import RunRecord, RunStatus, Verdict
from tests.support.helpers import T0, claim_request


def claimed() -> RunRecord:
    return decisions.claim(None, claim_request(), T0).record


def test_absent_record_is_claimed() -> None:
    assert decisions.decide(None, T0) is Verdict.CLAIMED


def test_each_status_decides_as_documented() -> None:
    record = claimed()
    assert decisions.decide(record, T0) is Verdict.IN_PROGRESS
    assert decisions.decide(record, record.lease_expires) is Verdict.IN_PROGRESS  # Skew bound.
    assert decisions.decide(record, record.lease_expires + c.MAX_CLOCK_SKEW) is Verdict.CLAIMED
    assert decisions.decide(decisions.completed(record, "1", T0), T0) is Verdict.COMPLETED
    assert decisions.decide(decisions.failed(record, "e", None, T0), T0) is Verdict.FAILED
    assert decisions.decide(decisions.released(record, "e", T0), T0) is Verdict.CLAIMED


def test_a_claim_of_an_expired_record_counts_from_the_first_attempt_but_keeps_fencing() -> None:
    record = decisions.completed(claimed(), None, T0)
    later = decisions.claim(record, claim_request(attempt_id="attempt-2"), record.expire_at)
    assert (later.verdict, later.record.attempts, later.record.fencing_token) == (
        Verdict.CLAIMED,
        1,  # The expired record counts as absent: its attempts are not this run's.
        2,  # Tokens never repeat for one run.
    )


def test_claim_keeps_retention_at_least_as_long_as_the_lease() -> None:
    request = claim_request(lease=timedelta(hours=2), retention=timedelta(hours=1))
    record = decisions.claim(None, request, T0).record
    # Past the lease by the clock-skew grace at least: gone earlier, a takeover would skip it.
    assert record.expire_at == record.lease_expires + c.MAX_CLOCK_SKEW


def test_renewal_never_lets_retention_end_before_the_lease() -> None:
    record = claimed()
    renewed = decisions.renewed(record, record.expire_at + timedelta(days=1))
    assert renewed.expire_at == renewed.lease_expires + c.MAX_CLOCK_SKEW
    kept = decisions.renewed(record, record.expire_at + timedelta(days=1), timedelta(hours=2))
    assert kept.expire_at == kept.lease_expires + timedelta(hours=2)


def test_holds_requires_matching_attempt_and_in_progress() -> None:
    record = claimed()
    assert decisions.holds(record, "attempt-1")
    assert not decisions.holds(record, "attempt-2")
    assert not decisions.holds(decisions.completed(record, None, T0), "attempt-1")
    assert not decisions.holds(None, "attempt-1")


def test_release_keeps_error_and_status() -> None:
    record = decisions.released(claimed(), "RuntimeError: x", T0)
    assert (record.status, record.error, record.lease_expires) == (
        RunStatus.RELEASED,
        "RuntimeError: x",
        T0,
    )


@pytest.mark.parametrize("result", [{1, 2}, float("nan"), {(1, 2): "a"}, object()])
def test_results_json_cannot_encode_are_refused_with_the_reason(result: object) -> None:
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        decisions.serialize_result(result)


def test_results_serialise_once_to_compact_json_in_the_handlers_key_order() -> None:
    assert decisions.serialize_result({"b": [1, "a"], "a": None}) == '{"b":[1,"a"],"a":null}'
    assert decisions.serialize_result({1: "one", "total": 1}) == '{"1":"one","total":1}'
    assert decisions.serialize_result(None) is None


def test_oversized_result_is_replaced_by_a_note() -> None:
    note = decisions.serialize_result("x" * 100_000)
    assert note is not None
    assert "over" in json.loads(note)["tasklease_result_dropped"]


def test_a_finish_is_recognised_only_by_its_own_attempt_and_status() -> None:
    done = decisions.completed(claimed(), None, T0)
    assert decisions.finished_by(done, "attempt-1", RunStatus.COMPLETED)
    assert not decisions.finished_by(done, "attempt-2", RunStatus.COMPLETED)
    assert not decisions.finished_by(done, "attempt-1", RunStatus.FAILED)
    assert not decisions.finished_by(done, "attempt-1", None)


def test_a_run_bound_to_a_caller_is_forbidden_to_every_other_caller() -> None:
    record = decisions.claim(None, claim_request(caller="a@x"), T0).record
    assert decisions.decide(record, T0, "a@x") is Verdict.IN_PROGRESS
    assert decisions.decide(record, T0, "b@x") is Verdict.FORBIDDEN
    assert decisions.decide(record, T0, None) is Verdict.FORBIDDEN
    unbound = claimed()
    assert decisions.decide(unbound, T0, "b@x") is Verdict.IN_PROGRESS


@pytest.mark.parametrize("size", [10, c.MAX_ERROR_CHARS, c.MAX_ERROR_CHARS + 1, 100_000])
def test_error_text_is_kept_whole_up_to_the_cap_and_cut_with_a_note_beyond(size: int) -> None:
    text = decisions.cap_text("e" * size)
    assert len(text) == min(size, c.MAX_ERROR_CHARS)
    assert ("[cut:" in text) == (size > c.MAX_ERROR_CHARS)


def test_a_delivery_near_its_slot_goes_to_the_manual_run_only_while_it_waits_for_a_retry() -> None:
    manual = claimed()
    takes = decisions.takes_manual_delivery
    assert not takes(None, T0, None)  # No manual run recorded: the slot's own.
    assert not takes(manual, T0, None)  # Live: the slot's own delivery is not turned away.
    assert takes(manual, manual.lease_expires + c.MAX_CLOCK_SKEW, None)  # Its holder is gone.
    assert takes(decisions.released(manual, "e", T0), T0, None)
    assert not takes(decisions.completed(manual, None, T0), T0, None)
    assert not takes(decisions.failed(manual, "e", None, T0), T0, None)
    assert not takes(decisions.released(manual, "e", T0), manual.expire_at, None)  # Expired.
    owned = decisions.released(manual, "e", T0).replace(caller="someone@example.com")
    assert not takes(owned, T0, "other@example.com")  # Another principal's run.
