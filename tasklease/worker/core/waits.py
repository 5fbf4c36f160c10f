"""Durable waits and signals: the pure rules. No I/O, no clock reads.

``ctx.wait_for(name, timeout=...)`` ends the delivery with the run ``waiting``: no instance is
held while it waits. A signal (``tasklease.signal``) or the wait's timeout resumes it through
a task with a name derived from the run and the wait, so it is created once. The resumed
delivery runs the handler again: its steps replay from the record, and ``wait_for`` returns
what resolved the wait, recorded as the step ``wait:<name>`` in the same write that takes the
signal, so every later attempt of that delivery gets the same answer.

``RunRecord.waits_json`` holds::

    {"wait": {"name": "approval", "seq": 0, "since": "<RFC 3339>", "deadline": null,
              "queue": "default", "route": "/tasks/", "audience": null, "member": null},
     "signals": {"approval": {"payload": "<JSON text>", "at": "<RFC 3339>"}},
     "delivered": {"approval": "signal"}}

``wait`` is the wait the run is suspended on (with where its resume task goes), ``signals``
the signals sent and not yet taken by a wait, ``delivered`` each wait name resolved, by a
signal or by its timeout. A name is delivered to a run once: another signal of that name is
a duplicate whatever its payload, so a sender that retries after a lost answer resumes the run
once, and a wait name is used once per run (as a step name is once per delivery).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any
from urllib.parse import quote, unquote

from tasklease import protocol
from tasklease.protocol import rfc3339
from tasklease.worker.core import steps
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.core.steps import StepError, StepRecord

# What a signal's payload may take as JSON: it becomes the result of the wait's step.
MAX_SIGNAL_PAYLOAD_BYTES = steps.MAX_STEP_RESULT_BYTES - 64
STEP_PREFIX = "wait:"
SIGNAL, TIMEOUT = "signal", "timeout"

# Statuses of a run no signal resumes: it has ended.
ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.SKIPPED, RunStatus.CANCELLED})


class SignalError(StepError):
    """A signal that cannot be sent as given (its name, or a payload JSON cannot hold or
    past :data:`MAX_SIGNAL_PAYLOAD_BYTES`): nothing was recorded."""


@dataclass(frozen=True)
class Wait:
    """The wait a run is suspended on, and where its resume task goes."""

    name: str
    seq: int  # The delivery of the run (0, or its continuation's number) that waits.
    since: datetime
    deadline: datetime | None = None  # None: no timeout.
    queue: str | None = None  # None: the producer's default queue.
    route: str = protocol.TASK_ROUTE_PREFIX
    audience: str | None = None  # The handler's own audience, when it sets one.
    member: str | None = None  # A fan-in child's member header, carried by its resume.


@dataclass(frozen=True)
class Suspension:
    """The wait an attempt suspends on, as its handler asked for it."""

    name: str
    seq: int
    since: datetime
    deadline: datetime | None


@dataclass(frozen=True)
class Signal:
    """A signal sent to a run and not yet taken by its wait."""

    payload_json: str
    at: datetime


@dataclass(frozen=True)
class Waits:
    """The parsed ``waits_json`` of a run."""

    wait: Wait | None = None
    signals: Mapping[str, Signal] = field(default_factory=dict)
    delivered: Mapping[str, str] = field(default_factory=dict)


NO_WAITS = Waits()


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))


def waits_of(record: RunRecord | None) -> Waits:
    """The waits and signals ``record`` keeps, or :data:`NO_WAITS`."""
    if record is None or not record.waits_json:
        return NO_WAITS
    data: dict[str, Any] = json.loads(record.waits_json)
    wait = data.get("wait")
    since = _time(wait["since"]) if wait else None
    return Waits(
        wait=None
        if not wait or since is None
        else Wait(
            name=wait["name"],
            seq=int(wait["seq"]),
            since=since,
            deadline=_time(wait.get("deadline")),
            queue=wait.get("queue"),
            route=wait.get("route", protocol.TASK_ROUTE_PREFIX),
            audience=wait.get("audience"),
            member=wait.get("member"),
        ),
        signals={
            name: Signal(entry["payload"], _time(entry["at"]) or datetime.min)
            for name, entry in data.get("signals", {}).items()
        },
        delivered=dict(data.get("delivered", {})),
    )


def encode(waits: Waits) -> str | None:
    """The stored text of ``waits``; None when it holds nothing."""
    if waits.wait is None and not waits.signals and not waits.delivered:
        return None
    data: dict[str, Any] = {}
    if (wait := waits.wait) is not None:
        data["wait"] = {
            "name": wait.name,
            "seq": wait.seq,
            "since": rfc3339(wait.since, "microseconds"),
            "deadline": None if wait.deadline is None else rfc3339(wait.deadline, "microseconds"),
            "queue": wait.queue,
            "route": wait.route,
            "audience": wait.audience,
            "member": wait.member,
        }
    if waits.signals:
        data["signals"] = {
            name: {"payload": signal.payload_json, "at": rfc3339(signal.at, "microseconds")}
            for name, signal in waits.signals.items()
        }
    if waits.delivered:
        data["delivered"] = dict(waits.delivered)
    return json.dumps(data, separators=(",", ":"))


def step_name(name: str) -> str:
    """The step that records how the wait ``name`` was resolved."""
    return f"{STEP_PREFIX}{name}"


def check_name(name: str) -> None:
    """Raise :class:`SignalError` unless ``name`` may name a wait (as a step name may)."""
    try:
        steps.check_key_name(name)
    except StepError as exc:
        raise SignalError(str(exc).replace("a step name", "a wait or signal name")) from None


def encode_payload(payload: Any) -> str:
    """A signal's payload as the JSON text kept; :class:`SignalError` if JSON cannot hold it
    or it is over :data:`MAX_SIGNAL_PAYLOAD_BYTES`."""
    try:
        encoded = json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise SignalError(f"the signal's payload is not JSON-serialisable: {exc}") from None
    size = len(encoded.encode())
    if size > MAX_SIGNAL_PAYLOAD_BYTES:
        raise SignalError(
            f"the signal's payload is {size} bytes of JSON, over {MAX_SIGNAL_PAYLOAD_BYTES} "
            "(MAX_SIGNAL_PAYLOAD_BYTES): store it elsewhere and send its key"
        )
    return encoded


def resumable(record: RunRecord, now: datetime) -> bool:
    """Whether a waiting ``record`` may be resumed at ``now``: its signal has come, or its
    timeout is due."""
    if record.status is not RunStatus.WAITING:
        return False
    state = waits_of(record)
    wait = state.wait
    if wait is None:
        return True  # Nothing to wait for (a record written by hand): let it run.
    return wait.name in state.signals or (wait.deadline is not None and now >= wait.deadline)


def signal_due(record: RunRecord) -> Wait | None:
    """The wait of a waiting ``record`` whose signal has come (its resume task is due)."""
    state = waits_of(record)
    if record.status is RunStatus.WAITING and state.wait and state.wait.name in state.signals:
        return state.wait
    return None


def suspended(record: RunRecord, wait: Wait) -> str | None:
    """``record``'s waits with ``wait`` as the one it is suspended on; a wait already
    recorded for the same name and delivery keeps its start and deadline (a retry of the
    delivery reaching the wait again does not move its timeout)."""
    state = waits_of(record)
    kept = state.wait
    if kept is not None and (kept.name, kept.seq) == (wait.name, wait.seq):
        wait = Wait(
            wait.name,
            wait.seq,
            kept.since,
            kept.deadline,
            wait.queue,
            wait.route,
            wait.audience,
            wait.member,
        )
    return encode(Waits(wait, state.signals, state.delivered))


def shows_suspension(record: RunRecord | None, wait: Wait) -> bool:
    """Whether ``record`` shows ``wait`` recorded: still the run's wait (waiting, or claimed
    by a delivery that resumes it), or resolved since."""
    if record is None:
        return False
    state = waits_of(record)
    kept = state.wait
    return (kept is not None and (kept.name, kept.seq) == (wait.name, wait.seq)) or (
        wait.name in state.delivered
    )


def resolved(
    record: RunRecord, name: str, seq: int, attempt_id: str, now: datetime
) -> tuple[RunRecord, StepRecord] | None:
    """How the wait ``name`` of delivery ``seq`` resolves at ``now``: the record with its
    signal taken (or its timeout noted) and the step recording it; None while neither has
    come. A signal wins over a timeout that is also due."""
    state = waits_of(record)
    wait = state.wait
    signal = state.signals.get(name)
    if signal is not None:
        result_json, how = f'{{"signal":{signal.payload_json}}}', SIGNAL
    elif (
        wait is not None
        and (wait.name, wait.seq) == (name, seq)
        and wait.deadline is not None
        and now >= wait.deadline
    ):
        result_json = json.dumps({"timed_out": rfc3339(wait.deadline, "microseconds")})
        how = TIMEOUT
    else:
        return None
    left = Waits(
        None if wait is not None and wait.name == name else wait,
        {other: kept for other, kept in state.signals.items() if other != name},
        {**state.delivered, name: how},
    )
    step = StepRecord(step_name(name), result_json, attempt_id, now, len(result_json.encode()))
    return steps.with_step(record.replace(waits_json=encode(left)), step), step


@dataclass(frozen=True)
class Resolution:
    """A wait's resolution as the store gave it: ``held`` whether the attempt still holds
    the run; ``step`` how the wait resolved (None: neither its signal nor its timeout has
    come)."""

    held: bool
    step: StepRecord | None = None


class Signalled(StrEnum):
    """What a signal found."""

    RESUMES = "resumes"  # The run waits for it: its resume task is enqueued.
    KEPT = "kept"  # The run has not reached its wait: it gets the signal there.
    DUPLICATE = "duplicate"  # A signal of this name was sent to the run before.
    TIMED_OUT = "timed_out"  # The wait of that name ended with its timeout.
    ENDED = "ended"  # The run completed, failed, was skipped or was cancelled.
    MISSING = "missing"  # No such run, or past its retention.

    @property
    def accepted(self) -> bool:
        """Whether the run gets (or got) a signal of this name: ``tasklease.signal``'s
        answer."""
        return self in (Signalled.RESUMES, Signalled.KEPT, Signalled.DUPLICATE)


@dataclass(frozen=True)
class SignalDecision:
    """What a signal found, and the wait whose resume task is due, if any (a duplicate's
    too: the first signal's enqueue may have failed after its record landed)."""

    outcome: Signalled
    record: RunRecord | None
    resume: Wait | None = None


def signalled(
    record: RunRecord | None, name: str, payload_json: str, now: datetime, *, live: bool
) -> tuple[RunRecord | None, SignalDecision]:
    """The record to write (None: nothing) for the signal ``name`` sent at ``now``, and the
    decision. ``live``: whether ``record`` is within its retention."""
    if record is None or not live:
        return None, SignalDecision(Signalled.MISSING, record)
    if record.status in ENDED or record.cancelled_at is not None:
        return None, SignalDecision(Signalled.ENDED, record)
    state = waits_of(record)
    if state.delivered.get(name) == TIMEOUT:
        return None, SignalDecision(Signalled.TIMED_OUT, record)
    if name in state.delivered or name in state.signals:
        return None, SignalDecision(Signalled.DUPLICATE, record, signal_due(record))
    signals = {**state.signals, name: Signal(payload_json, now)}
    written = record.replace(waits_json=encode(Waits(state.wait, signals, state.delivered)))
    total = sum(
        len(text.encode())
        for text in (written.steps_json, written.continuation_json, written.waits_json)
        if text
    )
    if total > steps.MAX_RUN_STEP_BYTES:
        raise SignalError(
            f"run {record.run_id}: its pending signals and steps would take {total} bytes, "
            f"over the per-run cap of {steps.MAX_RUN_STEP_BYTES}: send a smaller payload"
        )
    due = signal_due(written)
    outcome = Signalled.RESUMES if due is not None else Signalled.KEPT
    return written, SignalDecision(outcome, written, due)


# --- The resume task ------------------------------------------------------------------


@dataclass(frozen=True)
class Resume:
    """What a resume task's :data:`~tasklease.protocol.RESUME_HEADER` names: the run, the
    delivery and wait it resumes, and whether it is the wait's timeout."""

    run_id: str
    seq: int
    name: str
    timeout: bool


def resume_key(run_id: str, wait: Wait, *, timeout: bool) -> str:
    """The producer key of the task that resumes ``wait`` (by signal, or at its timeout): one
    name per wait, so a signal sent twice, or a suspension retried, creates it once."""
    digest = hashlib.sha256(wait.name.encode()).hexdigest()[:16]
    return f"{run_id}-wait-{wait.seq}-{digest}-{TIMEOUT if timeout else SIGNAL}"


def resume_header(run_id: str, wait: Wait, *, timeout: bool) -> str:
    """The value of :data:`~tasklease.protocol.RESUME_HEADER` on ``wait``'s resume task."""
    return f"{run_id}:{wait.seq}:{TIMEOUT if timeout else SIGNAL}:{quote(wait.name, safe='')}"


def parse_resume_header(value: str) -> Resume | None:
    """The :class:`Resume` a header names; None if it is not one."""
    parts = value.split(":", 3)
    if len(parts) != 4:
        return None
    run_id, seq, how, quoted = parts
    if not (len(run_id) == 64 and all(ch in "0123456789abcdef" for ch in run_id)):
        return None
    if not (seq.isascii() and seq.isdigit() and 0 < len(seq) <= 9) or how not in (SIGNAL, TIMEOUT):
        return None
    name = unquote(quoted)
    try:
        steps.check_key_name(name)
    except StepError:
        return None
    return Resume(run_id, int(seq), name, how == TIMEOUT)


# --- Operators ------------------------------------------------------------------------


def summary(record: RunRecord) -> dict[str, Any] | None:
    """A run's wait and signals for operators (``tasklease runs show``, the dashboard):
    names, times and sizes, never the payloads. None when it has none."""
    state = waits_of(record)
    if state is NO_WAITS:
        return None
    wait = state.wait
    return {
        "wait": None
        if wait is None or record.status is not RunStatus.WAITING
        else {
            "name": wait.name,
            "delivery": wait.seq,
            "since": rfc3339(wait.since),
            "deadline": None if wait.deadline is None else rfc3339(wait.deadline),
            "signalled": wait.name in state.signals,
        },
        "pending_signals": [
            {"name": name, "at": rfc3339(signal.at), "payload_bytes": len(signal.payload_json)}
            for name, signal in state.signals.items()
        ],
        "delivered": dict(state.delivered),
    }


def summary_lines(record: RunRecord) -> list[str]:
    """:func:`summary` as the text lines of ``tasklease runs show``."""
    shown = summary(record)
    if shown is None:
        return []
    lines = []
    if (wait := shown["wait"]) is not None:
        until = f"until {wait['deadline']}" if wait["deadline"] else "with no timeout"
        come = ", its signal has come" if wait["signalled"] else ""
        lines.append(f"{'waits for':<18} {wait['name']!r} since {wait['since']}, {until}{come}")
    lines += [
        f"{'signal pending':<18} {s['name']!r} sent {s['at']}, {s['payload_bytes']} bytes"
        for s in shown["pending_signals"]
    ]
    lines += [
        f"{'wait resolved':<18} {name!r} by {how}" for name, how in shown["delivered"].items()
    ]
    return lines
