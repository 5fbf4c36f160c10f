"""What the worker did with a request: the ``X-Tasklease-Outcome`` header and the log field,
and the HTTP status and ``Retry-After`` each outcome is answered with.

The queue reads only the status: Cloud Tasks and Cloud Scheduler stop on a 2xx and retry
anything else, so every outcome that must end the task answers 200 and every one that must be
retried does not. The tables of README's "How a delivery is handled" are these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from enum import IntEnum, StrEnum
from types import MappingProxyType

from tasklease.worker.core.constants import (
    LOCK_BUSY_RETRY_AFTER_MAX,
    MAX_CLOCK_SKEW,
    STORE_UNAVAILABLE_RETRY_AFTER,
)


class Outcome(StrEnum):
    """Every way a request to the worker can end (its status: :data:`STATUS`)."""

    PROCESSED = "processed"  # The handler ran and its completion was recorded.
    DUPLICATE = "duplicate"  # The run was completed or failed before; nothing ran.
    IN_PROGRESS = "in_progress"  # Another attempt holds an unexpired lease.
    FAILED = "failed"  # Recorded as failed permanently (a dead letter); the queue stops.
    RELEASED = "released"  # The handler raised; the claim was given back for a retry.
    LOST_CLAIM = "lost_claim"  # The lease was taken over while the handler ran.
    UNRECORDED = "unrecorded"  # The handler ran but the store could not record how it ended.
    REJECTED = "rejected"  # The request is not a valid delivery; nothing was claimed.
    UNAUTHENTICATED = "unauthenticated"  # No valid ID token.
    FORBIDDEN = "forbidden"  # A valid token from a caller that is not allowed.
    SKIPPED_OVERLAP = "skipped_overlap"  # An exclusive job's other run held it; recorded.
    WAITING = "waiting"  # The run waits for a signal (ctx.wait_for); nothing runs until it comes.
    CANCELLED = "cancelled"  # The run was cancelled (tasklease.cancel): never runs again.
    KEY_BUSY = "key_busy"  # Another task of the same concurrency key runs; retry later.
    UNAVAILABLE = "unavailable"  # The store (or key server) is down; nothing ran.
    ERROR = "error"  # The worker itself failed unexpectedly (a bug); see the log line.


class Rejection(IntEnum):
    """Why a request is not a delivery: the 4xx status of outcome ``rejected``."""

    MALFORMED = 400  # Retried by both services: the retry brings the whole request.
    NO_HANDLER = 404  # Retried: a retry may reach a newer deploy that has the handler.
    NOT_POST = 405
    TOO_LARGE = 413


STATUS: Mapping[Outcome, int] = MappingProxyType(
    {
        Outcome.PROCESSED: 200,
        Outcome.DUPLICATE: 200,
        Outcome.FAILED: 200,
        Outcome.SKIPPED_OVERLAP: 200,
        Outcome.WAITING: 200,
        Outcome.CANCELLED: 200,
        Outcome.REJECTED: Rejection.MALFORMED.value,  # Or another Rejection's.
        Outcome.UNAUTHENTICATED: 401,
        Outcome.FORBIDDEN: 403,
        Outcome.IN_PROGRESS: 409,
        Outcome.LOST_CLAIM: 409,
        Outcome.KEY_BUSY: 409,
        Outcome.RELEASED: 500,
        Outcome.ERROR: 500,
        Outcome.UNRECORDED: 503,
        Outcome.UNAVAILABLE: 503,
    }
)

# Outcomes always answered with a Retry-After: the store's pause, or one computed for the wait.
STORE_DOWN = frozenset({Outcome.UNAVAILABLE, Outcome.UNRECORDED})
WAIT = frozenset({Outcome.IN_PROGRESS, Outcome.KEY_BUSY})


def default_retry_after(outcome: Outcome) -> int | None:
    """The ``Retry-After`` an outcome carries unless its answer computes one."""
    return STORE_UNAVAILABLE_RETRY_AFTER if outcome in STORE_DOWN else None


def lease_retry_after(lease_expires: datetime, now: datetime) -> int:
    """Seconds until another attempt's lease may be taken over (``MAX_CLOCK_SKEW`` past its
    expiry), at least 1."""
    remaining = (lease_expires + MAX_CLOCK_SKEW - now).total_seconds()
    return max(1, int(remaining + 0.999))


def lock_retry_after(free_at: datetime, now: datetime, *, released: bool) -> int:
    """Seconds until a lock another run holds may be taken, at least 1; capped at
    ``LOCK_BUSY_RETRY_AFTER_MAX`` while its holder is live (it may end at any moment)."""
    wait = (free_at - now).total_seconds()
    if not released:
        wait = min(wait, LOCK_BUSY_RETRY_AFTER_MAX)
    return max(1, math.ceil(wait))
