"""What the store contract suites share: a fixed time, and claim and lock requests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tasklease.worker.core.constants import MAX_CLOCK_SKEW
from tasklease.worker.core.records import ClaimRequest, LockRequest

T0 = datetime(2026, 10, 16, 12, 0, 0, tzinfo=UTC)
LEASE = timedelta(minutes=5)
# The first moment another attempt may take an unrenewed lease over.
EXPIRED = LEASE + MAX_CLOCK_SKEW
HOUR = timedelta(hours=1)


def claim_request(
    run_id: str = "run-1", attempt_id: str = "attempt-1", **changes: Any
) -> ClaimRequest:
    """A task's claim of ``run_id`` (lease 5 minutes, kept 7 days), with ``changes``."""
    fields: dict[str, Any] = {
        "run_id": run_id,
        "kind": "task",
        "handler": "h",
        "attempt_id": attempt_id,
        "lease": LEASE,
        "retention": timedelta(days=7),
        "identity": {"queue": "default", "task_name": "t"},
    }
    fields.update(changes)
    return ClaimRequest(**fields)


def lock_request(
    run_id: str = "run-a", attempt_id: str = "a1", name: str = "job/nightly", **changes: Any
) -> LockRequest:
    """Run ``run_id``'s request for lock ``name`` (max_runtime an hour), with ``changes``."""
    fields: dict[str, Any] = {"lease": LEASE, "max_runtime": HOUR}
    fields.update(changes)
    return LockRequest(name=name, run_id=run_id, attempt_id=attempt_id, **fields)
