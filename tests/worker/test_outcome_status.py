"""The answer each outcome gets: one table (``core/outcome.py``), the one README documents."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from tasklease.worker.core.constants import (
    LOCK_BUSY_RETRY_AFTER_MAX,
    MAX_CLOCK_SKEW,
    STORE_UNAVAILABLE_RETRY_AFTER,
)
from tasklease.worker.core.outcome import (
    STATUS,
    STORE_DOWN,
    WAIT,
    Outcome,
    Rejection,
    default_retry_after,
    lease_retry_after,
    lock_retry_after,
)
from tasklease.worker.delivery.reply import Reply
from tests.support.checkout import ROOT

NOW = datetime(2026, 10, 16, 12, tzinfo=UTC)
OFFSETS = st.floats(min_value=-3600, max_value=3600, allow_nan=False)


def readme_rows() -> list[tuple[str, str]]:
    """(answer, outcome) of each row of the tables in "How a delivery is handled"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## How a delivery is handled", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"`[a-z_]+`", cells[3]):
            rows.append((cells[2] if cells[2][:1].isdigit() else cells[1], cells[3].strip("`")))
    return rows


def test_every_outcome_has_a_status() -> None:
    assert set(STATUS) == set(Outcome)
    assert all(100 <= status <= 599 for status in STATUS.values())


def test_only_the_outcomes_that_end_the_task_answer_2xx() -> None:
    ending = {
        Outcome.PROCESSED,
        Outcome.DUPLICATE,
        Outcome.FAILED,
        Outcome.SKIPPED_OVERLAP,
        Outcome.WAITING,
        Outcome.CANCELLED,
    }
    assert {outcome for outcome, status in STATUS.items() if status < 300} == ending


def test_the_table_is_the_one_the_readme_documents() -> None:
    rows = readme_rows()
    assert len(rows) >= 12
    for answer, outcome in rows:
        status = int(answer.split()[0])
        assert STATUS[Outcome(outcome)] == status, (answer, outcome)
        carries = Outcome(outcome) in WAIT | STORE_DOWN
        assert ("Retry-After" in answer) == carries, (answer, outcome)


def test_a_rejection_is_a_4xx_with_outcome_rejected_as_the_readme_lists() -> None:
    text = (ROOT / "README.md").read_text()
    refused = text.split("Requests are refused before anything is claimed:", 1)[1]
    refused = refused.split("Every request", 1)[0]
    for rejection in Rejection:
        reply = Reply.rejected(rejection, "no")
        assert (reply.status, reply.outcome, reply.retry_after) == (
            rejection.value,
            Outcome.REJECTED,
            None,
        )
        assert 400 <= reply.status < 500
        assert f"{rejection.value} (" in refused, rejection
    assert STATUS[Outcome.REJECTED] == Rejection.MALFORMED


def test_a_reply_takes_its_status_and_store_pause_from_the_table() -> None:
    for outcome in Outcome:
        reply = Reply.of(outcome, "m", "run")
        assert reply.status == STATUS[outcome]
        assert reply.retry_after == default_retry_after(outcome)
        assert ("Retry-After" in reply.headers()) == (outcome in STORE_DOWN)
    assert default_retry_after(Outcome.UNAVAILABLE) == STORE_UNAVAILABLE_RETRY_AFTER


@given(OFFSETS)
def test_a_lease_wait_is_at_least_a_second_and_covers_the_clock_skew(seconds: float) -> None:
    lease_expires = NOW + timedelta(seconds=seconds)
    wait = lease_retry_after(lease_expires, NOW)
    assert wait >= 1
    # Rounded up from a millisecond past the second (int(x + 0.999)), as it always was.
    assert NOW + timedelta(seconds=wait + 0.001) >= lease_expires + MAX_CLOCK_SKEW


@given(OFFSETS, st.booleans())
def test_a_lock_wait_is_at_least_a_second_and_short_while_its_holder_lives(
    seconds: float, released: bool
) -> None:
    free_at = NOW + timedelta(seconds=seconds)
    wait = lock_retry_after(free_at, NOW, released=released)
    assert wait >= 1
    if released:
        assert NOW + timedelta(seconds=wait) >= free_at
    else:
        assert wait <= LOCK_BUSY_RETRY_AFTER_MAX
