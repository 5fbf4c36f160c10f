from __future__ import annotations

from datetime import timedelta

import pytest

from tests.helpers import T0, claim_request
from worker import constants as c
from worker import decisions
from worker.records import RunStatus, Verdict


def claimed():  # type: ignore[no-untyped-def]
    return decisions.claim(None, claim_request(), T0).record


def test_absent_record_is_claimed() -> None:
    assert decisions.decide(None, T0) is Verdict.CLAIMED


def test_each_status_decides_as_documented() -> None:
    record = claimed()
    assert decisions.decide(record, T0) is Verdict.IN_PROGRESS
    assert decisions.decide(record, record.lease_expires) is Verdict.CLAIMED
    assert decisions.decide(decisions.completed(record, 1, T0), T0) is Verdict.COMPLETED
    assert decisions.decide(decisions.failed(record, "e", None, T0), T0) is Verdict.FAILED
    assert decisions.decide(decisions.released(record, "e", T0), T0) is Verdict.CLAIMED


def test_claim_keeps_retention_at_least_as_long_as_the_lease() -> None:
    request = claim_request(lease=timedelta(hours=2), retention=timedelta(hours=1))
    record = decisions.claim(None, request, T0).record
    assert record.expire_at == record.lease_expires


def test_renewal_never_lets_retention_end_before_the_lease() -> None:
    record = claimed()
    renewed = decisions.renewed(record, record.expire_at + timedelta(days=1))
    assert renewed.expire_at == renewed.lease_expires


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


def test_results_that_are_not_json_are_replaced_by_a_note() -> None:
    assert "not JSON" in decisions.cap_result({1, 2})["tasklease_result_dropped"]
    assert "not JSON" in decisions.cap_result(float("nan"))["tasklease_result_dropped"]
    assert decisions.cap_result([1, "a"]) == [1, "a"]


@pytest.mark.parametrize("size", [10, c.MAX_ERROR_CHARS, c.MAX_ERROR_CHARS + 1, 100_000])
def test_error_text_is_kept_whole_up_to_the_cap_and_cut_with_a_note_beyond(size: int) -> None:
    text = decisions.cap_text("e" * size)
    assert len(text) == min(size, c.MAX_ERROR_CHARS)
    assert ("[cut:" in text) == (size > c.MAX_ERROR_CHARS)
