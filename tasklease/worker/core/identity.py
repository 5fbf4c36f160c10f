"""Parse and validate the identity of a delivery from its headers. Pure: no I/O.

A delivery's identity is what stays the same across every retry of one task or one scheduled
run: queue + task name for Cloud Tasks, job name + schedule time for Cloud Scheduler, plus the
optional project and location that disambiguate them. Its hash is the run id.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TypeVar

from tasklease import joins, protocol
from tasklease.errors import InvalidDelivery
from tasklease.joins import Member
from tasklease.protocol import rfc3339
from tasklease.worker.core import constants as c
from tasklease.worker.core.steps import parse_continuation_header
from tasklease.worker.core.waits import Resume, parse_resume_header

_T = TypeVar("_T")

# Cloud Tasks task IDs: letters, digits, hyphens, underscores (docs/platform-facts.md).
_TASK_NAME = re.compile(rf"[A-Za-z0-9_-]{{1,{protocol.MAX_TASK_NAME_LENGTH}}}", re.ASCII)
_QUEUE_NAME = re.compile(rf"[A-Za-z0-9-]{{1,{protocol.MAX_QUEUE_NAME_LENGTH}}}", re.ASCII)
_JOB_NAME = re.compile(rf"[A-Za-z0-9_-]{{1,{protocol.MAX_JOB_NAME_LENGTH}}}", re.ASCII)
_PROJECT = re.compile(r"[a-z0-9:.-]{1,100}", re.ASCII)
_LOCATION = re.compile(r"[a-z0-9-]{1,63}", re.ASCII)
_RETRY_REASON = re.compile(r"[\x20-\x7e]{0,256}", re.ASCII)
_JOIN_ID = re.compile(r"[0-9a-f]{32}", re.ASCII)
_RUN_ID = re.compile(r"[\x21-\x7e]{1,1024}", re.ASCII)  # A parent's: printable, no spaces.
_MAX_COUNT = 10**9
# ETA / schedule times outside this range are not something either service sends.
_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
_LATEST = datetime(2200, 1, 1, tzinfo=UTC)


class Kind(StrEnum):
    """Which service delivered the request."""

    TASK = "task"
    SCHEDULER = "scheduler"


HeaderLookup = Callable[[str], Sequence[str]]
"""Returns every value of a header, looked up case-insensitively."""


@dataclass(frozen=True)
class DeliveryIdentity:
    """The fields of one delivery; ``key`` and ``run_id`` ignore the per-attempt ones."""

    kind: Kind
    handler: str
    project: str | None = None
    location: str | None = None
    queue: str | None = None
    task_name: str | None = None
    job_name: str | None = None
    schedule_time: datetime | None = None
    manual: bool = False  # A manual Scheduler run ("jobs run", "Force run"), not the slot's.
    # Not certainly manual, nor certainly the slot's own: arrived within the manual-run margin
    # of its schedule time, before or after it. A manual run's retries carry the same headers
    # as the slot's own delivery, so only the store's record of the manual run can tell
    # (tasklease.worker.delivery.manual_runs). On a manual identity: taken as the manual run's
    # because that run was waiting for a retry; the slot's own if it cannot claim it.
    maybe_manual: bool = False
    # A continuation task (ctx.continue_later) resumes the run it names: its own queue and
    # task name are not the run's identity. 0: not a continuation.
    continues: str | None = None
    continuation_seq: int = 0
    # A task resuming a waiting run (its signal came, or its timeout is due): the run and its
    # delivery are the header's, as a continuation's are.
    resumes: Resume | None = None
    # A child of a fan-out with then= (counted in its join when it finishes), and a join's
    # then task (the join whose results it gets).
    fan_in: Member | None = None
    fan_in_of: str | None = None
    # A child of a plain fan-out: its parent's run id (a join's child names it in fan_in).
    parent_run_id: str | None = None
    # Per-attempt fields, informational only.
    retry_count: int | None = None
    execution_count: int | None = None
    eta: datetime | None = None
    previous_response: int | None = None
    retry_reason: str | None = None

    @property
    def key(self) -> str:
        """The normalised identity: equal for every delivery of one task or scheduled run."""
        if self.kind is Kind.TASK or self.schedule_time is None:  # A task, or a continuation.
            parts = [self.queue or "", self.task_name or ""]
        else:
            assert self.schedule_time is not None
            parts = [self.job_name or "", rfc3339(self.schedule_time, "microseconds")]
            if self.manual:
                # Its own run, derived from the slot it names, so its retries stay one run
                # while the slot's own delivery still runs.
                parts.append("manual")
        return "/".join(
            [self.kind.value, self.project or "", self.location or "", self.handler, *parts]
        )

    @property
    def run_id(self) -> str:
        """A fixed-length hash of :attr:`key`; document ids and logs use it (a continuation:
        the run it resumes)."""
        if self.continues is not None:
            return self.continues
        return hashlib.sha256(self.key.encode()).hexdigest()

    def as_manual(self) -> DeliveryIdentity:
        """This delivery read as (a retry of) a manual run of its slot."""
        return dataclasses.replace(self, manual=True)

    def as_slot(self) -> DeliveryIdentity:
        """This delivery read as the slot's own run, settled."""
        return dataclasses.replace(self, manual=False, maybe_manual=False)

    @property
    def parent(self) -> str | None:
        """The run that fanned this delivery's run out, if any: a cancelled parent's children
        never run."""
        if self.parent_run_id is not None:
            return self.parent_run_id
        return self.fan_in.parent_run_id if self.fan_in is not None else None

    @property
    def is_retry(self) -> bool:
        """Whether Cloud Tasks says it tried this task before (the counts are hints only:
        the run record decides)."""
        return bool(self.retry_count or self.execution_count)

    @property
    def trigger(self) -> str:
        """``manual`` for a manual Scheduler run, else ``scheduled`` (or ``task``)."""
        if self.kind is Kind.TASK:
            return "task"
        return "manual" if self.manual else "scheduled"

    def fields(self) -> dict[str, str]:
        """The stable identity fields as strings, for the run record."""
        raw = {
            "project": self.project,
            "location": self.location,
            "queue": self.queue,
            "task_name": self.task_name,
            "job_name": self.job_name,
            "schedule_time": rfc3339(self.schedule_time, "microseconds")
            if self.schedule_time
            else None,
            "trigger": self.trigger if self.kind is Kind.SCHEDULER else None,
        }
        return {name: value for name, value in raw.items() if value is not None}


def parse_identity(
    kind: Kind,
    handler: str,
    header: HeaderLookup,
    query: Mapping[str, str],
    *,
    project_header: str = protocol.PROJECT_HEADER,
    location_header: str = protocol.LOCATION_HEADER,
    received_at: datetime | None = None,
    manual_run_margin: timedelta = c.DEFAULT_MANUAL_RUN_MARGIN,
) -> DeliveryIdentity:
    """Build the identity of a delivery, or raise :class:`InvalidDelivery` saying why.

    A Scheduler delivery whose schedule time is more than ``manual_run_margin`` after
    ``received_at`` is a manual run: Cloud Scheduler sends the *next* slot's time with a manual
    run (docs/platform-facts.md), and that slot's own delivery must still run. Any other is
    ``maybe_manual``. The margin counts as at least ``MAX_CLOCK_SKEW``: the slot's own delivery
    never arrives before its slot, but a clock running behind may read it as early by that much.
    """
    project = _optional(header, project_header, _matching(_PROJECT)) or _query(
        query, protocol.PROJECT_QUERY, _PROJECT
    )
    location = _optional(header, location_header, _matching(_LOCATION)) or _query(
        query, protocol.LOCATION_QUERY, _LOCATION
    )
    continued = _optional(header, protocol.CONTINUATION_HEADER, parse_continuation_header)
    resumed = _optional(header, protocol.RESUME_HEADER, parse_resume_header)
    if continued is not None and resumed is not None:
        raise InvalidDelivery(
            f"{protocol.CONTINUATION_HEADER} and {protocol.RESUME_HEADER} are both sent; "
            "a task carries one of them"
        )
    if resumed is not None:
        continued = (resumed.run_id, resumed.seq)
    if kind is Kind.TASK or continued is not None:
        # A scheduled run's continuation is a Cloud Tasks task on the job's route: its kind
        # stays the route's, the run it resumes is the header's.
        return DeliveryIdentity(
            kind=kind,
            handler=handler,
            project=project,
            location=location,
            queue=_required(header, c.TASKS_QUEUE_NAME, _matching(_QUEUE_NAME)),
            task_name=_required(header, c.TASKS_TASK_NAME, _matching(_TASK_NAME)),
            retry_count=_optional(header, c.TASKS_RETRY_COUNT, _count),
            execution_count=_optional(header, c.TASKS_EXECUTION_COUNT, _count),
            eta=_optional(header, c.TASKS_ETA, _epoch_seconds),
            previous_response=_optional(header, c.TASKS_PREVIOUS_RESPONSE, _status_code),
            retry_reason=_optional(header, c.TASKS_RETRY_REASON, _matching(_RETRY_REASON)),
            continues=continued[0] if continued else None,
            continuation_seq=continued[1] if continued else 0,
            resumes=resumed,
            fan_in=_optional(header, protocol.FAN_IN_HEADER, joins.parse_header),
            fan_in_of=_optional(header, protocol.FAN_IN_OF_HEADER, _matching(_JOIN_ID)),
            parent_run_id=_optional(header, protocol.PARENT_HEADER, _matching(_RUN_ID)),
        )
    schedule_time = _required(header, c.SCHEDULER_SCHEDULE_TIME, parse_rfc3339)
    ahead = schedule_time - received_at if received_at is not None else timedelta(0)
    manual = ahead > max(manual_run_margin, c.MAX_CLOCK_SKEW)
    return DeliveryIdentity(
        kind=kind,
        handler=handler,
        project=project,
        location=location,
        job_name=_required(header, c.SCHEDULER_JOB_NAME, _matching(_JOB_NAME)),
        schedule_time=schedule_time,
        manual=manual,
        maybe_manual=not manual,
    )


def parse_rfc3339(value: str) -> datetime | None:
    """Parse an RFC 3339 timestamp with any offset into UTC; None if it is not one."""
    if not re.fullmatch(
        r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d{1,9})?([Zz]|[+-]\d\d:\d\d)", value, re.ASCII
    ):
        return None
    text = value.upper().replace("Z", "+00:00")
    # fromisoformat in Python < 3.11 takes at most 6 fractional digits.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    try:
        parsed = parsed.astimezone(UTC)
    except OverflowError:  # Year 9999 with a negative offset is past datetime.max in UTC.
        return None
    return parsed if _EARLIEST <= parsed < _LATEST else None


def _single(header: HeaderLookup, name: str) -> str | None:
    values = header(name)
    if not values:
        return None
    if len(values) > 1 and len(set(values)) > 1:
        raise InvalidDelivery(f"{name} is sent {len(values)} times with different values")
    value = values[0]
    if len(value) > c.MAX_HEADER_VALUE_LENGTH:
        raise InvalidDelivery(f"{name} is {len(value)} characters long; no valid value is")
    return value.strip()


def _required(header: HeaderLookup, name: str, parse: Callable[[str], _T | None]) -> _T:
    value = _single(header, name)
    if not value:
        raise InvalidDelivery(f"{name} header is missing")
    parsed = parse(value)
    if parsed is None:
        raise InvalidDelivery(f"{name} header is not valid: {value[:80]!r}")
    return parsed


def _optional(header: HeaderLookup, name: str, parse: Callable[[str], _T | None]) -> _T | None:
    value = _single(header, name)
    if not value:
        return None
    parsed = parse(value)
    if parsed is None:
        raise InvalidDelivery(f"{name} header is not valid: {value[:80]!r}")
    return parsed


def _query(query: Mapping[str, str], name: str, pattern: re.Pattern[str]) -> str | None:
    value = query.get(name)
    if value is None or value == "":
        return None
    if not pattern.fullmatch(value):
        raise InvalidDelivery(f"query parameter {name} is not valid: {value[:80]!r}")
    return value


def _matching(pattern: re.Pattern[str]) -> Callable[[str], str | None]:
    """A validator that accepts a value only when the whole of it matches ``pattern``."""
    return lambda value: value if pattern.fullmatch(value) else None


def _count(value: str) -> int | None:
    if not value.isdigit() or not value.isascii():
        return None
    number = int(value)
    return number if number <= _MAX_COUNT else None


def _status_code(value: str) -> int | None:
    number = _count(value)
    return number if number is not None and 100 <= number <= 599 else None


def _epoch_seconds(value: str) -> datetime | None:
    try:
        seconds = float(value)
    except ValueError:
        return None
    if not math.isfinite(seconds):
        return None
    try:
        moment = datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment if _EARLIEST <= moment < _LATEST else None
