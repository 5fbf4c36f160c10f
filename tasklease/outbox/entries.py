"""An outbox entry: the full task, as the caller's transaction stores it and the relay sends it.

The entry's id is the task's full resource name, derived from ``(task_name, key)`` exactly as
the producer names a task it creates (hash first, :mod:`tasklease.producer.naming`): every
re-send of an entry asks Cloud Tasks for the same name, and staging the same key twice keeps
one entry. An enqueue without a key gets a random name when it is staged, stored in the
entry, so the entry's re-sends still share it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tasklease.producer.transport import TaskRequest

TABLE = "tasklease_outbox"
CHANNEL = "tasklease_outbox"  # Postgres NOTIFY channel: delivered only when the insert commits.
PENDING, SENT, FAILED = "pending", "sent", "failed"
TRACE_HEADERS = ("traceparent", "tracestate", "X-Cloud-Trace-Context")
REASON_CHARS = 1000  # The most of a refusal's reason kept in the entry's last_error.

# The columns an enqueue writes, in order (the relay's own columns have defaults).
COLUMNS = (
    "id",
    "task_name",
    "queue",
    "task_id",
    "url",
    "body",
    "headers",
    "service_account",
    "audience",
    "schedule_time",
    "dispatch_deadline",
    "trace_context",
    "created_at",
    "next_attempt_at",
)


@dataclass(frozen=True)
class Entry:
    """One staged task and what the relay has made of it so far."""

    task_name: str
    request: TaskRequest
    created_at: float
    state: str = PENDING
    attempts: int = 0
    last_error: str | None = None
    sent_at: float | None = None

    @property
    def id(self) -> str:
        return self.request.name

    def row(self) -> dict[str, Any]:
        """The insert's parameters, by column name."""
        request = self.request
        trace = {name: request.headers[name] for name in TRACE_HEADERS if name in request.headers}
        return {
            "id": request.name,
            "task_name": self.task_name,
            "queue": request.queue_path,
            "task_id": request.task_id,
            "url": request.url,
            "body": request.body,
            "headers": json.dumps(request.headers, separators=(",", ":")),
            "service_account": request.service_account,
            "audience": request.audience,
            "schedule_time": (
                request.schedule_time.timestamp() if request.schedule_time is not None else None
            ),
            "dispatch_deadline": (
                request.dispatch_deadline.total_seconds()
                if request.dispatch_deadline is not None
                else None
            ),
            "trace_context": json.dumps(trace, separators=(",", ":")) if trace else None,
            "created_at": self.created_at,
            "next_attempt_at": self.created_at,
        }


@dataclass(frozen=True)
class Undecodable:
    """A claimed row the relay cannot read back as a task (written by hand, by another
    version, or damaged): the claim marked it failed with ``reason``, and sends the rest."""

    id: str
    reason: str


def from_row(row: Mapping[str, Any]) -> Entry:
    """An entry read back by the relay (a mapping of column name to value)."""
    schedule = row["schedule_time"]
    deadline = row["dispatch_deadline"]
    request = TaskRequest(
        queue_path=row["queue"],
        task_id=row["task_id"],
        url=row["url"],
        body=bytes(row["body"]),
        headers=dict(json.loads(row["headers"])),
        service_account=row["service_account"],
        audience=row["audience"],
        schedule_time=(datetime.fromtimestamp(schedule, UTC) if schedule is not None else None),
        dispatch_deadline=timedelta(seconds=deadline) if deadline is not None else None,
    )
    return Entry(
        task_name=row["task_name"],
        request=request,
        created_at=float(row["created_at"]),
        state=row["state"],
        attempts=int(row["attempts"]),
        last_error=row["last_error"],
        sent_at=row["sent_at"],
    )


def decode(row: Mapping[str, Any]) -> Entry | Undecodable:
    """The entry of one claimed row, or why it cannot be one: each row on its own, so one
    bad row never stops the relay for the others."""
    stored = row.get("id")
    stored_id = "" if stored is None else str(stored)
    try:
        entry = from_row(row)
        texts = (entry.task_name, entry.request.queue_path, entry.request.task_id)
        if not all(isinstance(text, str) for text in (*texts, entry.request.url)):
            raise TypeError("task_name, queue, task_id and url must be text")
        for name in ("service_account", "audience"):
            value = getattr(entry.request, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be text or null, not {type(value).__name__}")
    except Exception as exc:  # Whatever the row holds: a missing column, bad JSON, a blob...
        reason = f"undecodable outbox entry: {type(exc).__name__}: {exc}"
        return Undecodable(stored_id, reason[:REASON_CHARS])
    if entry.id != row.get("id"):
        # The marks find an entry by the name its queue and task_id make: this row's would
        # never be marked, and be sent again after every claim.
        return Undecodable(
            stored_id, "undecodable outbox entry: its id is not the name its queue and task_id make"
        )
    return entry
