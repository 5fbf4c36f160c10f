"""How a handler run ends, decided from what it raised: the one table both the plain path and
the transactional path (:mod:`tasklease.worker.delivery.endings` writes what it says) follow.

Pure: the exception in, an :class:`Ending` out, with the reason the store keeps and the
message the answer and the log line carry. Nothing here touches the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tasklease.errors import LeaseLost, PermanentFailure, StoreUnavailable
from tasklease.worker.core.outcome import Outcome

__all__ = ["Action", "Ending", "HandlerNotStarted", "UnserialisableResult", "ending_of"]


class HandlerNotStarted(Exception):
    """Something the handler needs could not start (the lease keeper's thread, the handler
    event loop): the handler never ran, so its claim is given back without counting it."""


class UnserialisableResult(Exception):
    """The handler's result is not JSON. Raised inside a transaction, so that it rolls back;
    a retry would get the same result, so the run fails."""


class Action(StrEnum):
    """What the store is asked to write for an ending."""

    COMPLETE = "complete"  # Record the result (or the continuation the handler asked for).
    FAIL = "fail"  # A dead letter: the reason and the body kept, the queue stops.
    GIVE_BACK = "give_back"  # Release the claim without recording an outcome.
    RETRY = "retry"  # The handler raised: released for a retry, the attempt counted.
    CHECK_COMMIT = "check_commit"  # The store failed mid-transaction: its record tells.


@dataclass(frozen=True)
class Ending:
    """How one handler run ends: the write, the answer's outcome, the reason the store keeps
    (``reason``) and the answer's message; ``counts``: whether the attempt counts towards
    ``max_attempts``; ``reraise``: the exception goes on once the run is given back (the
    process is being stopped); ``cause``: the exception's own text."""

    action: Action
    outcome: Outcome
    reason: str = ""
    message: str = ""
    counts: bool = True
    reraise: bool = False
    cause: str = ""


COMPLETED = Ending(Action.COMPLETE, Outcome.PROCESSED, message="processed")


def ending_of(exc: BaseException | None, *, in_transaction: bool) -> Ending:
    """The ending of a handler run that raised ``exc`` (None: it returned). In a transaction
    every ending but a commit rolled the handler's writes back, and a store error may hide a
    commit that landed."""
    if exc is None:
        return COMPLETED
    cause = str(exc)
    if isinstance(exc, HandlerNotStarted):
        return Ending(
            Action.GIVE_BACK, Outcome.UNAVAILABLE, cause, cause, counts=False, cause=cause
        )
    if isinstance(exc, PermanentFailure):
        reason = f"PermanentFailure: {exc}"
        return Ending(Action.FAIL, Outcome.FAILED, reason, reason, cause=cause)
    if isinstance(exc, UnserialisableResult):
        return Ending(Action.FAIL, Outcome.FAILED, cause, cause, cause=cause)
    if isinstance(exc, LeaseLost):
        return Ending(Action.GIVE_BACK, Outcome.LOST_CLAIM, f"LeaseLost: {exc}", cause, cause=cause)
    if in_transaction and isinstance(exc, StoreUnavailable):
        # The answer if the record shows no commit; one that landed is processed.
        return Ending(
            Action.CHECK_COMMIT,
            Outcome.UNAVAILABLE,
            f"the transaction did not commit: {exc}",
            f"lease store unavailable; rolled back: {exc}",
            cause=cause,
        )
    name = type(exc).__name__
    released = "rolled back and released" if in_transaction else "released"
    return Ending(
        Action.RETRY,
        Outcome.RELEASED,
        f"{name}: {exc}",
        f"handler raised {name}; {released} for a retry",
        reraise=isinstance(exc, KeyboardInterrupt),
        cause=cause,
    )
