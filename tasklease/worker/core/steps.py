"""Durable steps and continuations: the pure rules. No I/O, no clock reads.

The completed steps of a run's current delivery live in its run record
(``RunRecord.steps_json``), so the claim that starts an attempt returns them: replaying a step
reads nothing more. A delivery that continues (``ctx.continue_later``) is final: its steps are
dropped with that write, and the next delivery starts with none (step names may repeat across
deliveries; each delivery's :func:`step_key` differs). The field holds a JSON object, in the
order the steps completed::

    {"charge": {"result": "<the step's result as JSON text>", "attempt": "<attempt id>",
                "at": "<RFC 3339 time>", "size": <bytes of result>}, ...}

``RunRecord.continuation_json`` holds the last ``ctx.continue_later``: ``{"seq": n,
"state": <JSON value>, "at": "<RFC 3339>", "delay": seconds}``; ``seq`` 0 (no continuation)
is the run's first delivery.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tasklease.errors import PermanentFailure
from tasklease.protocol import rfc3339
from tasklease.worker.core.records import RunRecord

# Per step result, and for a delivery's steps and the continuation state it resumed with
# together (all the record holds of them: a continuing delivery's steps are dropped).
# Firestore keeps a record in one document of at most 1 MiB, which also holds a failed run's
# payload (up to the 1 MiB Cloud Tasks allows, rarely near it): the run cap leaves it room.
MAX_STEP_RESULT_BYTES = 256 * 1024
MAX_RUN_STEP_BYTES = 512 * 1024
MAX_STEP_NAME_LENGTH = 200
# Cloud Tasks schedules a task at most 30 days ahead (docs/platform-facts.md, "creating tasks").
MAX_CONTINUATION_DELAY = timedelta(days=30)


class StepError(PermanentFailure):
    """A step used against the rules (a repeated name, a result over a cap): retrying the run
    cannot help, so the run fails with this message as a dead letter."""


@dataclass(frozen=True)
class StepRecord:
    """One completed step of a run, as its record keeps it."""

    name: str
    result_json: str  # The step's return value as JSON text ("null" for None).
    attempt_id: str  # The attempt that completed it.
    completed_at: datetime
    size: int  # Bytes of result_json.

    @property
    def result(self) -> Any:
        return json.loads(self.result_json)


@dataclass(frozen=True)
class Continuation:
    """The last continuation a run recorded: delivery ``seq`` resumes it with ``state``."""

    seq: int
    state: Any
    at: datetime | None = None
    delay_seconds: float = 0.0


NO_CONTINUATION = Continuation(0, None)


def steps_of(record: RunRecord | None) -> dict[str, StepRecord]:
    """The completed steps of ``record``, in completion order."""
    if record is None or not record.steps_json:
        return {}
    stored: dict[str, dict[str, Any]] = json.loads(record.steps_json)
    return {
        name: StepRecord(
            name,
            entry["result"],
            entry["attempt"],
            datetime.fromisoformat(entry["at"].replace("Z", "+00:00")),
            int(entry["size"]),
        )
        for name, entry in stored.items()
    }


def continuation_of(record: RunRecord | None) -> Continuation:
    """The continuation ``record`` last recorded, or :data:`NO_CONTINUATION`."""
    if record is None or not record.continuation_json:
        return NO_CONTINUATION
    data = json.loads(record.continuation_json)
    at = data.get("at")
    return Continuation(
        int(data["seq"]),
        data.get("state"),
        None if at is None else datetime.fromisoformat(at.replace("Z", "+00:00")),
        float(data.get("delay", 0.0)),
    )


def check_key_name(name: str) -> None:
    """Raise :class:`StepError` unless ``name`` may name a step: a non-empty string of at
    most :data:`MAX_STEP_NAME_LENGTH` without NUL (:func:`step_key` separates its parts with
    NUL: a name holding one could take another delivery's step key)."""
    if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME_LENGTH:
        raise StepError(f"a step name is a non-empty string of at most {MAX_STEP_NAME_LENGTH}")
    if "\0" in name:
        raise StepError(f"step name {name!r}: a step name holds no NUL character")


def check_name(name: str, used: set[str]) -> None:
    """Raise :class:`StepError` unless ``name`` is a valid step name not yet used by this
    attempt (loops name their steps ``f"item-{i}"``)."""
    check_key_name(name)
    if name in used:
        raise StepError(
            f"step {name!r} is used twice in one delivery: step names must be unique "
            '(name the steps of a loop f"item-{i}")'
        )


def encode_result(name: str, result: Any) -> str:
    """A step's result as the JSON text stored; :class:`StepError` when JSON cannot hold it
    or it is over :data:`MAX_STEP_RESULT_BYTES`."""
    try:
        encoded = json.dumps(result, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise StepError(f"step {name!r}: its result is not JSON-serialisable: {exc}") from None
    size = len(encoded.encode())
    if size > MAX_STEP_RESULT_BYTES:
        raise StepError(
            f"step {name!r}: its result is {size} bytes of JSON, over the per-step cap of "
            f"{MAX_STEP_RESULT_BYTES} (MAX_STEP_RESULT_BYTES): store it elsewhere, return a key"
        )
    return encoded


def _entry(step: StepRecord) -> dict[str, Any]:
    return {
        "result": step.result_json,
        "attempt": step.attempt_id,
        "at": rfc3339(step.completed_at, "microseconds"),
        "size": step.size,
    }


def with_step(record: RunRecord, step: StepRecord) -> RunRecord:
    """``record`` with ``step`` added. Adding a step that attempt already recorded (a retried
    write that landed) changes nothing. :class:`StepError` past :data:`MAX_RUN_STEP_BYTES`."""
    stored: dict[str, Any] = json.loads(record.steps_json) if record.steps_json else {}
    if step.name in stored:
        return record
    stored[step.name] = _entry(step)
    steps_json = json.dumps(stored, separators=(",", ":"))
    total = len(steps_json.encode()) + len((record.continuation_json or "").encode())
    if total > MAX_RUN_STEP_BYTES:
        raise StepError(
            f"step {step.name!r}: the run's steps would take {total} bytes, over the per-run "
            f"cap of {MAX_RUN_STEP_BYTES} (MAX_RUN_STEP_BYTES)"
        )
    return record.replace(steps_json=steps_json)


def encode_continuation(continuation: Continuation) -> str:
    """The stored text of ``continuation``; :class:`StepError` when the state is not JSON or
    over :data:`MAX_STEP_RESULT_BYTES`."""
    state = encode_result("continue_later state", continuation.state)
    at = None if continuation.at is None else rfc3339(continuation.at, "microseconds")
    return (
        f'{{"seq":{continuation.seq},"at":{json.dumps(at)},'
        f'"delay":{continuation.delay_seconds!r},"state":{state}}}'
    )


def delay_seconds(delay: timedelta | float) -> float:
    """A continuation's delay in seconds; :class:`StepError` for one no continuation can have
    (negative, not finite, past :data:`MAX_CONTINUATION_DELAY`): retrying the run cannot
    change it, so it fails the run rather than release it for a retry that fails alike."""
    try:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if not (0 <= seconds <= MAX_CONTINUATION_DELAY.total_seconds()):  # NaN fails too.
        raise StepError(
            f"continue_later: the delay is between 0 and {MAX_CONTINUATION_DELAY.days} days "
            f"(Cloud Tasks schedules a task at most that far ahead), not {delay!r}"
        )
    return seconds


def step_key(run_id: str, name: str, delivery: int = 0) -> str:
    """A UUID-shaped idempotency key, the same for every attempt of step ``name`` of run
    ``run_id``'s delivery ``delivery`` (0: its own task, n: its n-th continuation), and a
    different one in each delivery, where a name may be used again (Google APIs'
    ``request_id`` fields want a UUID). Delivery 0 keeps the key of a run never continued."""
    scope = f"{run_id}\0{name}" if delivery == 0 else f"{run_id}\0{delivery}\0{name}"
    digest = hashlib.sha256(f"tasklease-step\0{scope}".encode()).hexdigest()
    return str(uuid.UUID(digest[:32]))


def enqueue_key(scope: tuple[str, ...], task: str, queue: str, ordinal: int) -> str:
    """The key of the ``ordinal``-th enqueue (from 0) of ``task`` on ``queue`` within
    ``scope`` (a run's delivery, and the step if inside one): 32 hex digits, the same on
    every attempt, so a retried handler's enqueues name the tasks its first attempt created.
    Counted per task and queue: enqueues of other tasks may move without changing it."""
    text = json.dumps(["tasklease-enqueue", *scope, task, queue, ordinal])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def continuation_key(run_id: str, seq: int) -> str:
    """The producer key of run ``run_id``'s continuation ``seq``: the task it names is created
    once (Cloud Tasks' name de-duplication), however often the delivery that continues it is
    retried."""
    return f"{run_id}-continuation-{seq}"


def continuation_header(run_id: str, seq: int) -> str:
    """The value of :data:`~tasklease.protocol.CONTINUATION_HEADER` on continuation ``seq``."""
    return f"{run_id}:{seq}"


def parse_continuation_header(value: str) -> tuple[str, int] | None:
    """The run id and sequence number a continuation header names; None if it is not one."""
    run_id, _, seq = value.partition(":")
    if not (len(run_id) == 64 and all(ch in "0123456789abcdef" for ch in run_id)):
        return None
    if not (seq.isascii() and seq.isdigit() and 0 < len(seq) <= 9) or int(seq) < 1:
        return None
    return run_id, int(seq)


def summary(record: RunRecord) -> dict[str, Any]:
    """A run's steps and continuation for operators (``tasklease runs show``): names,
    attempts, times and sizes, never the results themselves. The steps are those of the
    delivery the continuation's ``seq`` names (0 without one), the only ones the record
    keeps."""
    last = continuation_of(record)
    return {
        "steps": [
            {
                "name": step.name,
                "attempt_id": step.attempt_id,
                "completed_at": rfc3339(step.completed_at),
                "result_bytes": step.size,
            }
            for step in steps_of(record).values()
        ],
        "continuation": None
        if last.seq == 0
        else {
            "seq": last.seq,
            "at": None if last.at is None else rfc3339(last.at),
            "delay_seconds": last.delay_seconds,
            "state_bytes": len((record.continuation_json or "").encode()),
        },
    }


def summary_lines(record: RunRecord) -> list[str]:
    """:func:`summary` as the text lines of ``tasklease runs show``."""
    shown = summary(record)
    lines = [
        f"{'step':<18} {s['name']}  by {s['attempt_id']} at {s['completed_at']}, "
        f"{s['result_bytes']} bytes"
        for s in shown["steps"]
    ]
    if shown["continuation"] is not None:
        c = shown["continuation"]
        dropped = "(the steps of the deliveries that continued are dropped)"
        lines.insert(0, f"{'steps of delivery':<18} {c['seq']} {dropped}")
        lines.append(
            f"{'continuation':<18} {c['seq']} at {c['at']} (delay {c['delay_seconds']} s, "
            f"{c['state_bytes']} bytes of state)"
        )
    return lines
