"""The Spanner store's joins: ``<table>_fan_ins`` and ``<table>_fan_in_entries``.

A join is one row (its counts), and each counted child one row of the entries table keyed by
the join and the child's key, so a child can never count twice. Both are written in the same
read-write transaction as the child's run row (:meth:`SpannerStore._read_modify_write_member`).

The entries are interleaved in their join (``INTERLEAVE IN PARENT ... ON DELETE CASCADE``):

- a join and its entries are stored together, so the transaction that counts a child and the
  query that lists a join's entries touch one place, and an entry can never outlive its join;
- deleting the join deletes its entries in the same operation, whether ``purge_expired`` does
  it or, in production, the join's row deletion policy (on ``expire_at``, which every count
  moves on), and counts as one mutation however many entries it has ("Mutations per commit",
  https://cloud.google.com/spanner/quotas). Entries in a table of their own would either never
  be deleted by Spanner, or need a policy of their own on a time each entry takes from its
  own count: the first children's entries would then go before their join, and a duplicate
  of such a child would count again;
- an entry cannot exist without its join, so the one query that reads the join in a child's
  transaction also tells whether the child is counted (3 RPCs for a child's finish: the run's
  row, that query, the Commit).

Every child's count writes the join's row, which Spanner locks until the commit: one join
takes its children's counts one at a time (see :mod:`tasklease.worker.core.fan_in` for the
sharded alternative a store may use).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from google.cloud import spanner

from tasklease.plumbing.spanner_calls import guard, run_transaction
from tasklease.worker.core.fan_in import ChildEntry, FanInRecord
from tasklease.worker.core.records import RunStatus
from tasklease.worker.stores.spanner.runs import key_set
from tasklease.worker.stores.spanner.schema import fan_in_tables, utc

__all__ = ["SpannerFanIns", "SpannerJoinRows"]

_P = spanner.param_types
_JOIN_COLUMNS = (
    "join_id", "parent_run_id", "then_handler", "expected", "completed", "failed",
    "created_at", "expire_at", "then_enqueued_at",
)  # fmt: skip
_ENTRY_COLUMNS = (
    "join_id", "child_key", "run_id", "status", "finished_at", "result", "error",
)  # fmt: skip


class SpannerJoinRows:
    """A join's rows inside one read-write transaction (:class:`~tasklease.worker.stores.base.
    fan_ins.JoinRows`), for the child ``key``.

    The join and whether ``key`` is counted are read by one query. An entry is buffered after
    its join's row: a commit applies its mutations in the order given (CommitRequest,
    https://cloud.google.com/spanner/docs/reference/rpc/google.spanner.v1), and an interleaved
    row needs its parent (the emulator refuses an entry written before a new join's row with
    NOT_FOUND "key was not found in parent table")."""

    def __init__(self, transaction: Any, runs_table: str, key: str) -> None:
        self._transaction = transaction
        self._joins, self._entries = fan_in_tables(runs_table)
        self._key = key
        self._counted: dict[tuple[str, str], bool] = {}
        self._held: list[ChildEntry] = []

    def join(self, join_id: str) -> FanInRecord | None:
        columns = ", ".join(f"j.{name}" for name in _JOIN_COLUMNS)
        sql = (
            f"SELECT {columns}, EXISTS(SELECT 1 FROM {self._entries} AS e "  # noqa: S608
            "WHERE e.join_id = j.join_id AND e.child_key = @key) "
            f"FROM {self._joins} AS j WHERE j.join_id = @join_id"
        )
        rows = list(
            self._transaction.execute_sql(
                sql,
                params={"join_id": join_id, "key": self._key},
                param_types={"join_id": _P.STRING, "key": _P.STRING},
            )
        )
        # No join row: no entry either (an entry is interleaved in its join).
        self._counted[(join_id, self._key)] = bool(rows and rows[0][-1])
        return _join(rows[0][:-1]) if rows else None

    def has_entry(self, join_id: str, key: str) -> bool:
        if (join_id, key) not in self._counted:
            found = self._transaction.read(self._entries, ("child_key",), key_set([join_id, key]))
            self._counted[(join_id, key)] = bool(list(found))
        return self._counted[(join_id, key)]

    def add_entry(self, entry: ChildEntry) -> None:
        self._held.append(entry)  # Written after its join's row (see the class).
        self._counted[(entry.join_id, entry.key)] = True

    def put_join(self, join: FanInRecord) -> None:
        self._transaction.insert_or_update(self._joins, _JOIN_COLUMNS, [_join_row(join)])
        self.flush()

    def flush(self) -> None:
        """Buffer the entries added since the last write (their join's row already is)."""
        if self._held:
            rows = [_entry_row(entry) for entry in self._held]
            self._transaction.insert(self._entries, _ENTRY_COLUMNS, rows)
            self._held.clear()


class SpannerFanIns:
    """The joins kept beside the runs table ``runs_table``, in the ``spanner.Database`` that
    ``database`` gives: the reads of :class:`~tasklease.worker.stores.base.fan_ins.
    FanInStore` and its note of a ``then`` task, each call bounded by ``call_timeout``."""

    def __init__(self, database: Callable[[], Any], runs_table: str, call_timeout: float) -> None:
        self._database = database
        self.table, self.entries_table = fan_in_tables(runs_table)
        self._timeout = call_timeout

    def get(self, join_id: str) -> FanInRecord | None:
        database = self._database()
        with guard("read a fan-in"), database.snapshot() as snapshot:
            rows = list(snapshot.read(self.table, _JOIN_COLUMNS, key_set([join_id])))
        return _join(rows[0]) if rows else None

    def entries(self, join_id: str, after: str | None, limit: int) -> list[ChildEntry]:
        sql = (
            f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM {self.entries_table} "  # noqa: S608
            "WHERE join_id = @join_id AND child_key > @after ORDER BY child_key LIMIT @limit"
        )
        params = {"join_id": join_id, "after": after or "", "limit": limit}
        types = {"join_id": _P.STRING, "after": _P.STRING, "limit": _P.INT64}
        return [_entry(row) for row in self._query(sql, params, types, "read a fan-in's entries")]

    def of_parent(self, parent_run_id: str, limit: int) -> list[FanInRecord]:
        sql = (
            f"SELECT {', '.join(_JOIN_COLUMNS)} FROM {self.table} "  # noqa: S608
            "WHERE parent_run_id = @parent "
            "ORDER BY created_at DESC, join_id DESC LIMIT @limit"
        )
        params = {"parent": parent_run_id, "limit": limit}
        types = {"parent": _P.STRING, "limit": _P.INT64}
        return [_join(row) for row in self._query(sql, params, types, "list a run's fan-ins")]

    def mark_then_enqueued(self, join_id: str, now: datetime) -> None:
        sql = (
            f"UPDATE {self.table} SET then_enqueued_at = @now "  # noqa: S608
            "WHERE join_id = @join_id AND then_enqueued_at IS NULL"
        )
        params = {"now": now, "join_id": join_id}
        types = {"now": _P.TIMESTAMP, "join_id": _P.STRING}
        with guard("note a fan-in's then task"):
            run_transaction(
                self._database(),
                lambda transaction: transaction.execute_update(
                    sql, params=params, param_types=types
                ),
                self._timeout,
                f"note fan-in {join_id}'s then task",
            )

    def _query(
        self, sql: str, params: dict[str, Any], types: dict[str, Any], action: str
    ) -> list[list[Any]]:
        database = self._database()
        with guard(action), database.snapshot() as snapshot:
            return list(snapshot.execute_sql(sql, params=params, param_types=types))


def _join_row(join: FanInRecord) -> list[Any]:
    return [
        join.join_id,
        join.parent_run_id,
        join.then,
        join.expected,
        join.completed,
        join.failed,
        join.created_at,
        join.expire_at,
        join.then_enqueued_at,
    ]


def _join(row: list[Any]) -> FanInRecord:
    join_id, parent, then, expected, completed, failed, created, expire, enqueued = row
    return FanInRecord(
        join_id,
        parent,
        then,
        int(expected),
        utc(created),
        utc(expire),
        completed=int(completed),
        failed=int(failed),
        then_enqueued_at=None if enqueued is None else utc(enqueued),
    )


def _entry_row(entry: ChildEntry) -> list[Any]:
    return [
        entry.join_id,
        entry.key,
        entry.run_id,
        entry.status.value,
        entry.finished_at,
        entry.result_json,
        entry.error,
    ]


def _entry(row: list[Any]) -> ChildEntry:
    join_id, key, run_id, status, finished, result, error = row
    return ChildEntry(join_id, key, run_id, RunStatus(status), utc(finished), result, error)
