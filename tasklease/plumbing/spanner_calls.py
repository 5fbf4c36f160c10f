"""How the Spanner store and the Spanner outbox call Spanner: bounded RPCs, read-write
transactions run again on contention, and every failure turned into :class:`StoreUnavailable`.

The client's own defaults let a Commit or a streaming read wait up to an hour, so a frozen
database would hang the request. :func:`bound_calls` gives every RPC of a client one deadline,
its retries on UNAVAILABLE included (:mod:`tasklease.plumbing.rpc_deadlines`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from google.api_core import exceptions as api
from google.api_core import retry as retries

from tasklease.errors import StoreUnavailable
from tasklease.plumbing.rpc_deadlines import bound_rpcs

_T = TypeVar("_T")

# Contention: the transaction committed nothing and may be run again. ABORTED is Spanner's
# answer. The emulator runs one read-write transaction at a time and, on a multiplexed session,
# answers a transaction it discarded for a newer one with NOT_FOUND "Transaction not found" at
# commit, or FAILED_PRECONDITION "Invalid transaction ID" or "Cannot read or query using a
# transaction after it has been committed or rolledback" at its read (seen with the emulator
# of gcloud 528 and google-cloud-spanner 3.71; the store never reads after its own commit):
# nothing of it was committed either.
_DISCARDED = (
    "transaction not found",
    "invalid transaction id",
    "after it has been committed or rolledback",
)
# Errors the client retries by itself within one call's deadline, as its defaults do.
_TRANSIENT = retries.if_exception_type(api.ServiceUnavailable, api.ResourceExhausted)
# First pause before running a transaction again, doubled up to the maximum, with jitter.
FIRST_PAUSE = 0.005
MAX_PAUSE = 0.5


def bound_calls(database: Any, timeout: float) -> None:
    """Give every RPC ``database``'s client makes a deadline of ``timeout`` seconds, its own
    retries on UNAVAILABLE included, unless the call sets one itself."""
    retry = retries.Retry(
        predicate=_TRANSIENT, initial=0.05, maximum=1.0, multiplier=2.0, timeout=timeout
    )
    bound_rpcs(database.spanner_api.transport, retry, timeout)


def contended(error: BaseException) -> bool:
    """Whether ``error`` ended a transaction that committed nothing and may run again."""
    if isinstance(error, api.Aborted):
        return True
    return isinstance(error, api.NotFound | api.FailedPrecondition) and any(
        text in str(error).lower() for text in _DISCARDED
    )


def run_transaction(database: Any, work: Callable[[Any], _T], timeout: float, what: str) -> _T:
    """Run ``work(transaction)`` in a read-write transaction and commit it, running it again
    (with a fresh transaction) while contention aborts it, for at most ``timeout`` seconds.

    ``work`` may be called several times: it must read what it decides from inside the
    transaction, and have no other effect.
    """
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE
    while True:
        try:
            # timeout_secs=0: the client's own loop does not run it again (its pauses start
            # at 2 s); contention is handled here, with shorter pauses and one deadline.
            result: _T = database.run_in_transaction(work, timeout_secs=0)
            return result
        except api.GoogleAPICallError as exc:
            if not contended(exc):
                raise
            if time.monotonic() + pause > deadline:
                raise StoreUnavailable(f"Spanner store: too much contention to {what}") from exc
        time.sleep(random.uniform(pause / 2, pause))
        pause = min(pause * 2, MAX_PAUSE)


@contextmanager
def guard(action: str) -> Iterator[None]:
    """Turn Spanner and transport errors into :class:`StoreUnavailable`."""
    try:
        yield
    except StoreUnavailable:
        raise
    except (api.GoogleAPIError, ValueError, OSError, TimeoutError) as exc:
        # GoogleAPIError covers RetryError (retries out of time) and every RPC error;
        # TimeoutError: a schema change's operation did not finish in time.
        raise StoreUnavailable(f"Spanner store: could not {action}: {exc}") from exc
