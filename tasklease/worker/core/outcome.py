"""What the worker did with a request: the ``X-Tasklease-Outcome`` header and the log field."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """Every way a request to the worker can end."""

    PROCESSED = "processed"  # 200: the handler ran and its completion was recorded.
    DUPLICATE = "duplicate"  # 200: the run was completed or failed before; nothing ran.
    IN_PROGRESS = "in_progress"  # 409: another attempt holds an unexpired lease.
    FAILED = "failed"  # 200: recorded as failed permanently (a dead letter); the queue stops.
    RELEASED = "released"  # 500: the handler raised; the claim was given back for a retry.
    LOST_CLAIM = "lost_claim"  # 409: the lease was taken over while the handler ran.
    UNRECORDED = "unrecorded"  # 503: the handler ran but the store could not record how it ended.
    REJECTED = "rejected"  # 4xx: the request is not a valid delivery; nothing was claimed.
    UNAUTHENTICATED = "unauthenticated"  # 401: no valid ID token.
    FORBIDDEN = "forbidden"  # 403: a valid token from a caller that is not allowed.
    SKIPPED_OVERLAP = "skipped_overlap"  # 200: an exclusive job's other run held it; recorded.
    KEY_BUSY = "key_busy"  # 409: another task of the same concurrency key runs; retry later.
    UNAVAILABLE = "unavailable"  # 503: the store (or key server) is down; nothing ran.
    ERROR = "error"  # 500: the worker itself failed unexpectedly (a bug); see the log line.
