"""The answer to one delivery: its status, ``X-Tasklease-Outcome``, ``Retry-After`` and body.

Built with :meth:`Reply.of` (or :meth:`Reply.rejected`), so the status and ``Retry-After``
come from :mod:`tasklease.worker.core.outcome`'s table, never from a literal beside an outcome.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tasklease import protocol
from tasklease.worker.core.outcome import (
    STATUS,
    Outcome,
    Rejection,
    default_retry_after,
    lease_retry_after,
)
from tasklease.worker.core.records import RunRecord, RunStatus, Verdict

# One encoder for every answer: json.dumps with options builds a new one per call.
_ENVELOPE_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


@dataclass
class Reply:
    """The answer to one delivery."""

    status: int
    outcome: Outcome
    message: str
    run_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    retry_after: int | None = None
    # The run's result as stored: JSON text spliced into the body as it is, so the first
    # answer and every duplicate's carry the same bytes.
    result_json: str | None = None

    @classmethod
    def of(
        cls,
        outcome: Outcome,
        message: str,
        run_id: str | None = None,
        details: dict[str, Any] | None = None,
        *,
        retry_after: int | None = None,
        result_json: str | None = None,
    ) -> Reply:
        """The answer ``outcome`` gets: its status from the table, and its ``Retry-After``
        unless this one computed it."""
        if retry_after is None:
            retry_after = default_retry_after(outcome)
        return cls(
            STATUS[outcome],
            outcome,
            message,
            run_id,
            {} if details is None else details,
            retry_after,
            result_json,
        )

    @classmethod
    def rejected(
        cls, rejection: Rejection, message: str, details: dict[str, Any] | None = None
    ) -> Reply:
        """The answer to a request that is not a delivery (nothing was claimed)."""
        return cls(rejection.value, Outcome.REJECTED, message, None, details or {})

    def body(self) -> dict[str, Any]:
        """The answer as a mapping (the result decoded), for programs and tests."""
        body = {
            "outcome": self.outcome.value,
            "message": self.message,
            "run_id": self.run_id,
            **self.details,
        }
        if self.result_json is not None:
            body["result"] = json.loads(self.result_json)
        return body

    def body_bytes(self) -> bytes:
        """The JSON answer: the envelope, then the stored result's own bytes."""
        envelope = _ENVELOPE_ENCODER.encode(
            {"outcome": self.outcome.value, "message": self.message, "run_id": self.run_id}
            | self.details
        )
        if self.result_json is None:
            return envelope.encode()
        return f'{envelope[:-1]},"result":{self.result_json}}}'.encode()

    def headers(self) -> dict[str, str]:
        headers = {protocol.OUTCOME_HEADER: self.outcome.value}
        if self.run_id:
            headers[protocol.RUN_ID_HEADER] = self.run_id
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return headers


def settled(verdict: Verdict, record: RunRecord, clock: Callable[[], datetime]) -> Reply:
    """The answer to a delivery the stored ``record`` does not let run (``verdict`` is not
    CLAIMED): finished, skipped, cancelled, held by another attempt, or another caller's."""
    run_id = record.run_id
    if verdict is Verdict.FORBIDDEN:
        # Say nothing of the run: not its status, result, attempts or owner.
        return Reply.of(Outcome.FORBIDDEN, "this run belongs to another caller", run_id)
    if verdict is Verdict.COMPLETED:
        return Reply.of(
            Outcome.DUPLICATE,
            "already completed",
            run_id,
            {"status": record.status.value},
            result_json=record.result_json,
        )
    if verdict is Verdict.FAILED:
        return Reply.of(
            Outcome.DUPLICATE,
            "already failed permanently",
            run_id,
            {"status": record.status.value, "error": record.error},
        )
    if verdict is Verdict.SKIPPED:
        held_by = (record.result or {}).get("held_by")
        return Reply.of(
            Outcome.SKIPPED_OVERLAP,
            f"skipped before: run {held_by} held the job",
            run_id,
            {"status": record.status.value, "held_by": held_by},
        )
    if verdict is Verdict.CANCELLED:
        return Reply.of(
            Outcome.CANCELLED,
            f"cancelled by {record.cancelled_by}; nothing ran",
            run_id,
            {"status": RunStatus.CANCELLED.value, "cancelled_by": record.cancelled_by},
        )
    return Reply.of(
        Outcome.IN_PROGRESS,
        "another attempt holds the lease",
        run_id,
        retry_after=lease_retry_after(record.lease_expires, clock()),
    )
