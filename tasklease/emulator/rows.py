"""The emulator's stored rows (tasks, deliveries, finished dispatches) and their SQL encoding."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasklease.emulator.sender import AttemptResult


@dataclass(frozen=True)
class TaskRow:
    """A pending task as stored. ``spec`` is the Task as created (protobuf JSON)."""

    name: str
    queue: str
    spec: dict[str, Any]
    schedule_us: int
    create_us: int
    dispatch_count: int
    response_count: int
    first_attempt: dict[str, Any] | None
    last_attempt: dict[str, Any] | None
    first_attempt_us: int | None
    previous_response: int | None
    retry_reason: str | None
    in_flight: bool
    # Responses other than 5xx: X-CloudTasks-TaskExecutionCount (response_count counts all).
    execution_count: int = 0


@dataclass(frozen=True)
class DeliveryRecord:
    """One HTTP request the emulator sent to a target, and how it ended."""

    kind: str  # "task" or "scheduler"
    queue: str | None
    name: str
    url: str
    attempt: int
    status: int | None  # None: no answer (deadline, connection error).
    outcome: str | None  # The worker's X-Tasklease-Outcome, if it sent one.
    fault: str | None  # "duplicate" or "lost_response" when injected.
    error: str | None
    started_us: int
    duration_ms: float

    @classmethod
    def of(
        cls, kind: str, queue: str | None, name: str, url: str, *, attempt: int, sent: AttemptResult
    ) -> DeliveryRecord:
        """The record of one request that was sent."""
        return cls(
            kind,
            queue,
            name,
            url,
            attempt,
            sent.status,
            sent.outcome,
            sent.fault,
            sent.error,
            sent.started_us,
            sent.duration_ms,
        )


@dataclass(frozen=True)
class Finish:
    """How one dispatch ended, to record: see :meth:`EmulatorDB.finish_attempt`."""

    name: str
    delete: bool
    now_us: int
    schedule_us: int
    responded: bool
    attempt: dict[str, Any]
    previous_response: int | None
    retry_reason: str | None
    executed: bool = False
    deliveries: Sequence[DeliveryRecord] = ()


TASK_COLUMNS = (
    "name, queue, spec, schedule_us, create_us, dispatch_count, response_count, first_attempt, "
    "last_attempt, first_attempt_us, previous_response, retry_reason, in_flight, execution_count"
)


INSERT_TASK = (
    f"INSERT INTO tasks ({TASK_COLUMNS}) SELECT {', '.join('?' * 14)} "  # noqa: S608
    "WHERE NOT EXISTS (SELECT 1 FROM tombstones WHERE name = ? AND at_us >= ?)"
)
RESCHEDULE = (
    "UPDATE tasks SET in_flight = 0, schedule_us = ?, "
    "dispatch_count = dispatch_count + 1, response_count = response_count + ?, "
    "execution_count = execution_count + ?, last_attempt = ?, "
    "first_attempt = COALESCE(first_attempt, ?), "
    "first_attempt_us = COALESCE(first_attempt_us, ?), previous_response = ?, "
    "retry_reason = ? WHERE name = ?"
)
INSERT_DELIVERY = (
    "INSERT INTO deliveries (kind, queue, name, url, attempt, status, outcome, fault, "
    "error, started_us, duration_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def delivery_values(record: DeliveryRecord) -> tuple[Any, ...]:
    return (
        record.kind,
        record.queue,
        record.name,
        record.url,
        record.attempt,
        record.status,
        record.outcome,
        record.fault,
        record.error,
        record.started_us,
        record.duration_ms,
    )


def encode_task(row: TaskRow) -> tuple[Any, ...]:
    return (
        row.name,
        row.queue,
        json.dumps(row.spec),
        row.schedule_us,
        row.create_us,
        row.dispatch_count,
        row.response_count,
        json.dumps(row.first_attempt) if row.first_attempt else None,
        json.dumps(row.last_attempt) if row.last_attempt else None,
        row.first_attempt_us,
        row.previous_response,
        row.retry_reason,
        int(row.in_flight),
        row.execution_count,
    )


def decode_task(row: tuple[Any, ...]) -> TaskRow:
    (
        name,
        queue,
        spec,
        schedule_us,
        create_us,
        dispatch_count,
        response_count,
        first_attempt,
        last_attempt,
        first_attempt_us,
        previous_response,
        retry_reason,
        in_flight,
        execution_count,
    ) = row
    return TaskRow(
        name=name,
        queue=queue,
        spec=json.loads(spec),
        schedule_us=schedule_us,
        create_us=create_us,
        dispatch_count=dispatch_count,
        response_count=response_count,
        first_attempt=json.loads(first_attempt) if first_attempt else None,
        last_attempt=json.loads(last_attempt) if last_attempt else None,
        first_attempt_us=first_attempt_us,
        previous_response=previous_response,
        retry_reason=retry_reason,
        in_flight=bool(in_flight),
        execution_count=execution_count,
    )
