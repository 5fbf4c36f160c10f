"""How a handler run ends, from what it raised: the one table the plain and the transactional
paths both write, every exception class under both values of ``in_transaction``."""

from __future__ import annotations

import asyncio

import pytest

from tasklease.errors import LeaseLost, PermanentFailure, StoreUnavailable
from tasklease.worker.core.endings import (
    Action,
    Ending,
    HandlerNotStarted,
    UnserialisableResult,
    ending_of,
)
from tasklease.worker.core.outcome import Outcome
from tasklease.worker.delivery.lease import KeeperNotStarted
from tasklease.worker.runtime.event_loop import HandlerCancelled, LoopNotStarted

BOTH = pytest.mark.parametrize("in_transaction", [False, True])


@BOTH
def test_a_handler_that_returned_completes(in_transaction: bool) -> None:
    assert ending_of(None, in_transaction=in_transaction) == Ending(
        Action.COMPLETE, Outcome.PROCESSED, message="processed"
    )


@BOTH
@pytest.mark.parametrize(
    "exc",
    [
        KeeperNotStarted("the lease keeper could not start: no threads"),
        LoopNotStarted("the handler event loop could not start: no threads"),
        HandlerNotStarted("could not start"),
    ],
)
def test_a_handler_that_never_started_gives_its_claim_back_uncounted(
    exc: Exception, in_transaction: bool
) -> None:
    ending = ending_of(exc, in_transaction=in_transaction)
    assert ending == Ending(
        Action.GIVE_BACK, Outcome.UNAVAILABLE, str(exc), str(exc), counts=False, cause=str(exc)
    )


@BOTH
def test_a_permanent_failure_is_a_dead_letter_naming_it(in_transaction: bool) -> None:
    ending = ending_of(PermanentFailure("no such order"), in_transaction=in_transaction)
    assert ending == Ending(
        Action.FAIL,
        Outcome.FAILED,
        "PermanentFailure: no such order",
        "PermanentFailure: no such order",
        cause="no such order",
    )


@BOTH
def test_an_unserialisable_result_is_a_dead_letter_with_the_encoders_reason(
    in_transaction: bool,
) -> None:
    reason = "the handler's result is not JSON: Object of type object"
    ending = ending_of(UnserialisableResult(reason), in_transaction=in_transaction)
    assert ending == Ending(Action.FAIL, Outcome.FAILED, reason, reason, cause=reason)


@BOTH
def test_a_lost_lease_gives_the_claim_back_counted(in_transaction: bool) -> None:
    ending = ending_of(LeaseLost("taken over"), in_transaction=in_transaction)
    assert ending == Ending(
        Action.GIVE_BACK,
        Outcome.LOST_CLAIM,
        "LeaseLost: taken over",
        "taken over",
        cause="taken over",
    )
    assert ending.counts


def test_a_store_error_inside_the_transaction_asks_the_record_whether_it_committed() -> None:
    ending = ending_of(StoreUnavailable("connection reset"), in_transaction=True)
    assert ending == Ending(
        Action.CHECK_COMMIT,
        Outcome.UNAVAILABLE,
        "the transaction did not commit: connection reset",
        "lease store unavailable; rolled back: connection reset",
        cause="connection reset",
    )


def test_a_store_error_the_plain_handler_raised_is_released_like_any_raise() -> None:
    ending = ending_of(StoreUnavailable("connection reset"), in_transaction=False)
    assert ending == Ending(
        Action.RETRY,
        Outcome.RELEASED,
        "StoreUnavailable: connection reset",
        "handler raised StoreUnavailable; released for a retry",
        cause="connection reset",
    )


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("try again"),
        ValueError("bad"),
        HandlerCancelled("the handler's task was cancelled"),
        asyncio.CancelledError(),
        SystemExit(2),
    ],
)
@pytest.mark.parametrize(
    ("in_transaction", "released"),
    [(False, "released"), (True, "rolled back and released")],
)
def test_any_other_raise_releases_the_run_for_a_retry(
    exc: BaseException, in_transaction: bool, released: str
) -> None:
    name = type(exc).__name__
    ending = ending_of(exc, in_transaction=in_transaction)
    assert ending == Ending(
        Action.RETRY,
        Outcome.RELEASED,
        f"{name}: {exc}",
        f"handler raised {name}; {released} for a retry",
        cause=str(exc),
    )
    assert not ending.reraise


@BOTH
def test_a_keyboard_interrupt_is_released_and_then_raised_again(in_transaction: bool) -> None:
    ending = ending_of(KeyboardInterrupt(), in_transaction=in_transaction)
    assert (ending.action, ending.outcome, ending.reason) == (
        Action.RETRY,
        Outcome.RELEASED,
        "KeyboardInterrupt: ",
    )
    assert ending.reraise
