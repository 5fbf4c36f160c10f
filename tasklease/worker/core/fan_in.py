"""Fan-in: the rules of a join, free of I/O.

A fan-out with ``then=`` names a join: ``expected`` children, each carrying
:data:`~tasklease.protocol.FAN_IN_HEADER` (its :class:`Member`). A child's final record
(completed, or failed for good) adds its :class:`ChildEntry` to the join in the same store operation
as the record itself, once per child key: a duplicated or retried child can never count twice,
and a finish whose answer was lost has counted. When the count reaches ``expected`` the
``then`` task is enqueued under a name derived from the join (:func:`then_key`), so however many
deliveries see the join close, one task exists, and its own run record runs it once.

A store may spread a join's counts over ``shards`` records (Firestore: a document takes about
one sustained write a second). Each child names its shard and how many children that shard
holds, so the child that fills a shard knows it without reading the others, and only those
``shards`` writes touch the join's root.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tasklease.joins import Member
from tasklease.worker.core.decisions import DROPPED_RESULT_KEY
from tasklease.worker.core.records import RunRecord, RunStatus

__all__ = [
    "COUNTED",
    "MAX_INLINE_RESULTS",
    "ChildEntry",
    "FanInRecord",
    "Progress",
    "ShardRecord",
    "counted",
    "entry_of",
    "kept_until",
    "new_shard",
    "opened",
    "shard_counted",
    "summary",
    "summary_lines",
    "summed",
]

# The children's final statuses: each counts once, with its result or its error. A
# cancelled child counts as failed (its entry says cancelled), so its join still closes.
COUNTED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
_FAILED = frozenset({RunStatus.FAILED, RunStatus.CANCELLED})

# A join is kept at least this long past its latest count, whatever its children's retention:
# longer than a child can be scheduled ahead (Cloud Tasks: 30 days), so a join still open when
# a child's record expires keeps its counts, and a then handler retried days later still pages
# its results.
JOIN_KEEP_FLOOR = timedelta(days=31)
MAX_INLINE_RESULTS = 1000  # Up to this many children, the then task's payload lists them all.


@dataclass(frozen=True)
class ChildEntry:
    """One finished child, as the join keeps it: ``status`` is ``completed``, ``failed`` or
    ``cancelled`` (counted as failed)."""

    join_id: str
    key: str
    run_id: str
    status: RunStatus
    finished_at: datetime
    result_json: str | None = None
    error: str | None = None
    shard: int = 0

    def as_result(self) -> dict[str, Any]:
        """The entry as the ``then`` handler's payload lists it."""
        return {
            "key": self.key,
            "status": self.status.value,
            "result": None if self.result_json is None else json.loads(self.result_json),
            "error": self.error,
        }


@dataclass(frozen=True)
class FanInRecord:
    """A join, as a store keeps it (summed over its shards, for a sharded store)."""

    join_id: str
    parent_run_id: str
    then: str
    expected: int
    created_at: datetime
    expire_at: datetime
    completed: int = 0
    failed: int = 0
    shards: int = 1
    shards_done: int = 0  # A sharded store's count of full shards; 0 elsewhere.
    then_enqueued_at: datetime | None = None

    @property
    def done(self) -> int:
        return self.completed + self.failed

    @property
    def closed(self) -> bool:
        """Every child has finished: the ``then`` task is due."""
        return self.done >= self.expected

    def replace(self, **changes: Any) -> FanInRecord:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ShardRecord:
    """One shard of a sharded store's join: the counts of the children hashed to it."""

    join_id: str
    shard: int
    expected: int
    completed: int = 0
    failed: int = 0

    @property
    def full(self) -> bool:
        return self.completed + self.failed >= self.expected


@dataclass(frozen=True)
class Progress:
    """What a child's counting left the join at: whether it is closed (every child counted)
    and whether its ``then`` task is known to be enqueued."""

    join_id: str
    closed: bool
    then_enqueued: bool


def entry_of(record: RunRecord | None, member: Member) -> ChildEntry | None:
    """The entry a child's record adds to its join: None until the record is final."""
    if record is None or record.status not in COUNTED or record.finished_at is None:
        return None
    result_json = record.result_json if record.status is RunStatus.COMPLETED else None
    error = record.error if record.status in _FAILED else None
    dropped = _dropped(result_json)
    if dropped is not None:  # Completed, but its result was too large to keep: say so.
        result_json, error = None, f"result dropped: {dropped}"
    return ChildEntry(
        member.join_id,
        member.key,
        record.run_id,
        record.status,
        record.finished_at,
        result_json,
        error,
        member.shard,
    )


def _dropped(result_json: str | None) -> str | None:
    """The note of a result the store replaced for its size, or None."""
    if result_json is None or not result_json.startswith('{"' + DROPPED_RESULT_KEY):
        return None
    note = json.loads(result_json)
    return str(note[DROPPED_RESULT_KEY]) if list(note) == [DROPPED_RESULT_KEY] else None


def kept_until(at: datetime, keep_for: timedelta) -> datetime:
    """How long a count made at ``at`` keeps its join (and, on a store that spreads a join over
    documents, each of them): ``keep_for`` (the child's retention) or the floor, if longer."""
    return at + max(keep_for, JOIN_KEEP_FLOOR)


def opened(member: Member, now: datetime, keep_for: timedelta) -> FanInRecord:
    """A join as its first counted child creates it."""
    return FanInRecord(
        member.join_id,
        member.parent_run_id,
        member.then,
        member.expected,
        now,
        kept_until(now, keep_for),
        shards=member.shards,
    )


def counted(
    join: FanInRecord, entry: ChildEntry, now: datetime, keep_for: timedelta
) -> FanInRecord:
    """``join`` with a newly added ``entry`` counted (call it only when the entry was new), and
    kept ``keep_for`` past now."""
    return join.replace(
        completed=join.completed + (entry.status is RunStatus.COMPLETED),
        failed=join.failed + (entry.status in _FAILED),
        expire_at=max(join.expire_at, kept_until(now, keep_for)),
    )


def shard_counted(shard: ShardRecord, entry: ChildEntry) -> ShardRecord:
    """``shard`` with a newly added ``entry`` counted."""
    return dataclasses.replace(
        shard,
        completed=shard.completed + (entry.status is RunStatus.COMPLETED),
        failed=shard.failed + (entry.status in _FAILED),
    )


def new_shard(member: Member) -> ShardRecord:
    return ShardRecord(member.join_id, member.shard, member.shard_expected)


def summary(join: FanInRecord, entries: Sequence[ChildEntry]) -> dict[str, Any]:
    """A join for operators (``tasklease runs show``, the dashboard): its counts and its
    finished children (keys, runs, statuses; never their results)."""
    from tasklease.protocol import rfc3339_or_none  # noqa: PLC0415 - operators only.

    return {
        "join_id": join.join_id,
        "then": join.then,
        "expected": join.expected,
        "completed": join.completed,
        "failed": join.failed,
        "pending": max(0, join.expected - join.done),
        "then_enqueued_at": rfc3339_or_none(join.then_enqueued_at),
        "children": [{"key": e.key, "run_id": e.run_id, "status": e.status.value} for e in entries],
    }


def summary_lines(shown: dict[str, Any]) -> list[str]:
    """One :func:`summary` as the text lines of ``tasklease runs show``."""
    then = shown["then_enqueued_at"]
    closing = f"then enqueued at {then}" if then else "then not yet enqueued"
    lines = [
        f"{'fan-in':<18} {shown['join_id']} -> {shown['then']}: "
        f"{shown['completed'] + shown['failed']}/{shown['expected']} finished "
        f"({shown['failed']} failed), {closing}"
    ]
    lines += [
        f"{'  child':<18} {c['key']}  {c['status']}  run {c['run_id']}" for c in shown["children"]
    ]
    return lines


def summed(root: FanInRecord, shards: Sequence[ShardRecord]) -> FanInRecord:
    """A sharded join's root with its shards' counts summed in."""
    return root.replace(
        completed=sum(s.completed for s in shards), failed=sum(s.failed for s in shards)
    )
