"""The relay's side of the Spanner outbox (:mod:`tasklease.outbox.spanner`): claim, mark,
report, over ``spanner://projects/P/instances/I/databases/D``.

A claim finds due pending entries (earliest due first, through the index on ``(state,
next_attempt_at)``) with a strong read that takes no locks, then pushes each ``lease`` seconds
ahead in a read-write transaction that reads them again by key: Spanner serialises two claims
of the same entries, and the later one skips those the other claimed, so racing relays take
disjoint batches; nothing is held across a Cloud Tasks call, and a relay that finds nothing
due runs no transaction (the callers' inserts never wait for an idle relay). A mark is a
read-write transaction that reads the entries' states and updates only those still pending
(mutations, 2 RPCs however many entries). Every RPC is bounded (the store's
:func:`~tasklease.plumbing.spanner_calls.bound_calls`) and a transaction aborted by
contention runs again with short pauses.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from tasklease.outbox import spanner as staging
from tasklease.outbox.base import Failed, OutboxDB, Status
from tasklease.outbox.entries import FAILED, PENDING, SENT, TABLE, Entry, Undecodable, decode
from tasklease.plumbing.url_secrets import shown_url

CALL_TIMEOUT = 10.0
_READ_COLUMNS = (*staging.WRITE_COLUMNS, "last_error", "sent_at")
_CLAIM_TRIES = 3
_CHUNK = 2000  # Entries marked per transaction (Spanner allows 80,000 mutated cells).


class SpannerOutbox(OutboxDB):
    """One relay's Spanner client for the outbox of ``projects/P/instances/I/databases/D``."""

    dialect = "spanner"

    def __init__(self, database: str, call_timeout: float = CALL_TIMEOUT) -> None:
        from google.cloud import spanner  # noqa: PLC0415 - the spanner extra.

        from tasklease.plumbing.spanner_calls import bound_calls  # noqa: PLC0415

        parts = database.split("/")
        if len(parts) != 6 or parts[0::2] != ["projects", "instances", "databases"]:
            raise ValueError(
                f"Spanner outbox {database!r}: use spanner://projects/P/instances/I/databases/D"
            )
        self.database_path = database
        self._spanner = spanner
        self._client = spanner.Client(project=parts[1])
        instance = self._client.instance(parts[3])  # type: ignore[no-untyped-call]
        self._database = instance.database(parts[5])
        self._timeout = call_timeout
        bound_calls(self._database, call_timeout)

    @classmethod
    def from_url(cls, url: str) -> SpannerOutbox:
        parts = urlsplit(url)
        if parts.query:
            raise ValueError(f"outbox URL {shown_url(url)!r}: a Spanner outbox takes no options")
        return cls(database_of(url))

    def close(self) -> None:
        self._forget()
        self._database = None
        self._client.close()  # type: ignore[no-untyped-call]

    def _run(self, work: Any, what: str) -> Any:
        from tasklease.plumbing.spanner_calls import run_transaction  # noqa: PLC0415

        return run_transaction(self._database, work, self._timeout * 3, what)

    def _query(self, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
        with self._database.snapshot() as snapshot:
            return list(snapshot.execute_sql(sql, **self._typed(params)))

    def _typed(self, params: dict[str, Any] | None) -> dict[str, Any]:
        if not params:
            return {}
        types = self._spanner.param_types
        kinds = {float: types.FLOAT64, int: types.INT64, str: types.STRING}
        typed = {
            name: types.Array(types.STRING) if isinstance(value, list) else kinds[type(value)]
            for name, value in params.items()
        }
        return {"params": params, "param_types": typed}

    def migrate(self) -> None:
        missing = {TABLE, f"{TABLE}_due"} - self._objects()
        if missing:
            self._database.update_ddl(staging.statements()).result(self._timeout * 12)

    def _objects(self) -> set[str]:
        return {
            row[0]
            for row in self._query(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = '' "
                "UNION ALL SELECT index_name FROM information_schema.indexes "
                "WHERE table_schema = '' AND index_type = 'INDEX'"
            )
        }

    def has_outbox(self) -> bool:
        try:
            return TABLE in self._objects()
        except Exception:  # Not reachable, no such database: no outbox to relay.
            return False

    def claim(self, limit: int, now: float, lease: float) -> list[Entry | Undecodable]:
        """Up to ``limit`` due pending entries, earliest due first, claimed until ``now +
        lease``. The due entries are found by a strong read outside any transaction (no locks
        on the index range the callers' inserts go to), then claimed in a read-write
        transaction that reads those rows by key, keeps the ones still pending and due, and
        pushes them ahead: of two relays that found the same entries, the one Spanner
        serialises second reads the first's claim and skips them. Nothing due: no
        transaction at all. A row that cannot be read back as an entry is marked failed in
        the claiming transaction."""
        sql = (
            f"SELECT id FROM {TABLE}@{{FORCE_INDEX={TABLE}_due}} "
            f"WHERE state = '{PENDING}' AND next_attempt_at <= @now "
            "ORDER BY next_attempt_at LIMIT @limit"
        )
        for _ in range(_CLAIM_TRIES):  # Again while other relays claimed all it found.
            due = [row[0] for row in self._query(sql, {"now": float(now), "limit": int(limit)})]
            if not due:
                return []
            claimed = self._claim_found(due, now, lease)
            if claimed:
                return claimed
        return []

    def _claim_found(self, due: list[str], now: float, lease: float) -> list[Entry | Undecodable]:
        """Claim the entries ``due`` that are still pending and due, in one transaction."""
        from google.cloud.spanner_v1 import KeySet  # noqa: PLC0415

        keys = KeySet(keys=[[name] for name in due])  # type: ignore[no-untyped-call]

        def work(tx: Any) -> list[Entry | Undecodable]:
            found = [
                dict(zip(_READ_COLUMNS, row, strict=True))
                for row in tx.read(TABLE, _READ_COLUMNS, keys)
            ]
            rows = [r for r in found if r["state"] == PENDING and r["next_attempt_at"] <= now]
            rows.sort(key=lambda row: row["next_attempt_at"])
            claimed = [_decode(row) for row in rows]
            good = [item.id for item in claimed if isinstance(item, Entry)]
            bad = [item for item in claimed if isinstance(item, Undecodable)]
            if good:
                until = float(now + lease)
                tx.update(TABLE, ("id", "next_attempt_at"), [[name, until] for name in good])
            if bad:
                attempts = {row["id"]: int(row["attempts"] or 0) for row in rows}
                tx.update(
                    TABLE,
                    ("id", "state", "attempts", "last_error"),
                    [[b.id, FAILED, attempts.get(b.id, 0) + 1, b.reason] for b in bad],
                )
            return claimed

        claimed: list[Entry | Undecodable] = self._run(work, "claim outbox entries")
        return claimed

    def _update_pending(
        self, changes: Mapping[str, Callable[[int], dict[str, Any]]], what: str
    ) -> None:
        """Apply each entry id's change (its ``attempts`` -> the columns to write) to its row,
        if still pending: per chunk, one read-write transaction that reads the rows' state
        (one read) and buffers one ``update`` mutation per column set (no DML statements)."""
        items = list(changes.items())
        for start in range(0, len(items), _CHUNK):
            chunk = dict(items[start : start + _CHUNK])

            def work(tx: Any, chunk: dict[str, Any] = chunk) -> None:
                from google.cloud.spanner_v1 import KeySet  # noqa: PLC0415

                keys = KeySet(keys=[[name] for name in chunk])  # type: ignore[no-untyped-call]
                found = tx.read(TABLE, ("id", "state", "attempts"), keys)
                groups: dict[tuple[str, ...], list[list[Any]]] = {}
                for name, state, attempts in found:
                    if state == PENDING:
                        columns = chunk[name](int(attempts))
                        values = [name, *columns.values()]
                        groups.setdefault(("id", *columns), []).append(values)
                for columns, values in groups.items():
                    tx.update(TABLE, columns, values)

            self._run(work, what)

    def mark_sent(self, ids: Sequence[str], now: float) -> None:
        sent = {
            "state": SENT,
            "sent_at": float(now),
            "sent_time": self._spanner.COMMIT_TIMESTAMP,
            "last_error": None,
        }
        self._update_pending(
            {name: lambda attempts: {**sent, "attempts": attempts + 1} for name in ids},
            "mark outbox entries sent",
        )

    def mark_failed(self, failures: Mapping[str, str]) -> None:
        def failed(reason: str) -> Callable[[int], dict[str, Any]]:
            return lambda attempts: {
                "state": FAILED,
                "attempts": attempts + 1,
                "last_error": reason,
            }

        changes = {name: failed(reason) for name, reason in failures.items()}
        self._update_pending(changes, "mark outbox entries failed")

    def retry_later(self, retries: Mapping[str, tuple[float, str]]) -> None:
        def later(at: float, error: str) -> Callable[[int], dict[str, Any]]:
            return lambda attempts: {
                "next_attempt_at": float(at),
                "attempts": attempts + 1,
                "last_error": error,
            }

        changes = {name: later(at, error) for name, (at, error) in retries.items()}
        self._update_pending(changes, "back outbox entries off")

    def _dml(self, sql: str, params: dict[str, Any] | None = None) -> int:
        """A statement over many rows, outside any transaction (partitioned DML)."""
        return int(self._database.execute_partitioned_dml(sql, **self._typed(params)))

    def requeue_failed(self) -> int:
        return self._dml(
            f"UPDATE {TABLE} SET state = '{PENDING}', next_attempt_at = created_at "
            f"WHERE state = '{FAILED}'"
        )

    def purge_sent(self, before: float, limit: int | None = None) -> int:
        """Delete sent entries older than ``before`` (the row deletion policy does it too).
        ``limit`` is not needed here: partitioned DML deletes partition by partition, each in
        a transaction of its own, never holding the whole table."""
        return self._dml(
            f"DELETE FROM {TABLE} WHERE state = '{SENT}' AND sent_at < @before",
            {"before": float(before)},
        )

    def pending(self, now: float) -> tuple[int, float]:
        sql = f"SELECT COUNT(*), MIN(created_at) FROM {TABLE} WHERE state = '{PENDING}'"
        count, oldest = self._query(sql)[0]
        return int(count), max(0.0, now - float(oldest)) if oldest is not None else 0.0

    def status(self, now: float, failed_limit: int = 50) -> Status:
        counts = {
            row[0]: (int(row[1]), row[2], int(row[3] or 0))
            for row in self._query(
                f"SELECT state, COUNT(*), MIN(created_at), "
                f"COUNTIF(attempts > 0) FROM {TABLE} GROUP BY state"
            )
        }
        failed = [
            Failed(row[0], row[1], int(row[2]), row[3] or "")
            for row in self._query(
                f"SELECT id, task_name, attempts, last_error FROM {TABLE} "
                f"WHERE state = '{FAILED}' ORDER BY created_at LIMIT {int(failed_limit)}"
            )
        ]
        depth, oldest, retrying = counts.get(PENDING, (0, None, 0))
        return Status(
            depth=depth,
            oldest_age=max(0.0, now - float(oldest)) if oldest is not None else 0.0,
            sent=counts.get(SENT, (0, None, 0))[0],
            failed=failed,
            retrying=retrying,
            failed_total=counts.get(FAILED, (0, None, 0))[0],
        )


def _decode(row: dict[str, Any]) -> Entry | Undecodable:
    """One claimed row's entry: the client reads BYTES back as the wire's base64 text, still
    encoded."""
    try:
        body = base64.b64decode(row["body"], validate=True)
    except (TypeError, ValueError) as exc:
        return Undecodable(str(row["id"]), f"undecodable outbox entry: body: {exc}")
    return decode({**row, "body": body})


def database_of(url: str) -> str:
    """``projects/P/instances/I/databases/D`` of a ``spanner://`` URL (options dropped)."""
    parts = urlsplit(url)
    return f"{parts.netloc}{parts.path}"
