"""The relay's own connection to the outbox table: claim, mark, report (SQLite or Postgres).

Claims are short transactions, never held across a Cloud Tasks call: a claimed entry's
``next_attempt_at`` moves ``lease`` seconds ahead, so another relay (or the sweeper) skips it
until then, and a relay that died mid-batch leaves its entries to be claimed again after the
lease (their re-send has the same name: ALREADY_EXISTS, taken as created). Postgres claims with
``FOR UPDATE SKIP LOCKED``, so concurrent relays take disjoint batches without waiting; SQLite
has one writer at a time (``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tasklease.errors import ConfigurationError
from tasklease.outbox import ddl
from tasklease.outbox.base import Failed, OutboxDB, Status
from tasklease.outbox.entries import (
    CHANNEL,
    FAILED,
    PENDING,
    SENT,
    TABLE,
    Entry,
    Undecodable,
    decode,
)
from tasklease.plumbing import private_files
from tasklease.plumbing.postgres_names import checked_schema
from tasklease.plumbing.url_secrets import scrubbed, shown_url, split_options

# The relay's interface is in tasklease.outbox.base; importable from here as it always was.
__all__ = [
    "Failed",
    "OutboxDB",
    "PostgresOutbox",
    "SQLOutbox",
    "SQLiteOutbox",
    "Status",
    "open_outbox",
]

_SELECT_DUE = (
    f"SELECT * FROM {TABLE} WHERE state = '{PENDING}' AND next_attempt_at <= {{p}} "
    "ORDER BY created_at LIMIT {p}"
)


class SQLOutbox(OutboxDB):
    """The outbox in a SQL table, through a DB-API driver (SQLite, Postgres)."""

    @abstractmethod
    def _transaction(self, immediate: bool = False) -> Any: ...

    @abstractmethod
    def _mark(self) -> str:
        """The placeholder of this driver."""

    def migrate(self) -> None:
        with self._transaction() as cursor:
            for statement in ddl.statements(self.dialect):
                cursor.execute(statement)

    def has_outbox(self) -> bool:
        try:
            with self._transaction() as cursor:
                cursor.execute(f"SELECT 1 FROM {TABLE} LIMIT 1")
                cursor.fetchall()
        except Exception:  # No such table, in the driver's own words.
            return False
        return True

    def claim(self, limit: int, now: float, lease: float) -> list[Entry | Undecodable]:
        p = self._mark()
        with self._transaction(immediate=True) as cursor:
            cursor.execute(_SELECT_DUE.format(p=p) + self._skip_locked(), (now, limit))
            rows = [_mapping(cursor, row) for row in cursor.fetchall()]
            claimed = [decode(row) for row in rows]
            pairs = list(zip(rows, claimed, strict=True))
            good = [row["id"] for row, item in pairs if isinstance(item, Entry)]
            bad = [(item.reason, row["id"]) for row, item in pairs if isinstance(item, Undecodable)]
            cursor.executemany(
                f"UPDATE {TABLE} SET next_attempt_at = {p} WHERE id = {p}",
                [(now + lease, entry_id) for entry_id in good],
            )
            if bad:
                cursor.executemany(
                    f"UPDATE {TABLE} SET state = '{FAILED}', attempts = attempts + 1, "
                    f"last_error = {p} WHERE id = {p}",
                    bad,
                )
        return claimed

    def mark_sent(self, ids: Sequence[str], now: float) -> None:
        p = self._mark()
        with self._transaction() as cursor:
            cursor.executemany(
                f"UPDATE {TABLE} SET state = '{SENT}', sent_at = {p}, attempts = attempts + 1, "
                f"last_error = NULL WHERE id = {p} AND state = '{PENDING}'",
                [(now, entry_id) for entry_id in ids],
            )

    def mark_failed(self, failures: Mapping[str, str]) -> None:
        p = self._mark()
        with self._transaction() as cursor:
            cursor.executemany(
                f"UPDATE {TABLE} SET state = '{FAILED}', attempts = attempts + 1, "
                f"last_error = {p} WHERE id = {p} AND state = '{PENDING}'",
                [(reason, entry_id) for entry_id, reason in failures.items()],
            )

    def retry_later(self, retries: Mapping[str, tuple[float, str]]) -> None:
        """Back off: each entry id -> (when to try again, the transient error)."""
        p = self._mark()
        with self._transaction() as cursor:
            cursor.executemany(
                f"UPDATE {TABLE} SET next_attempt_at = {p}, attempts = attempts + 1, "
                f"last_error = {p} WHERE id = {p} AND state = '{PENDING}'",
                [(at, error, entry_id) for entry_id, (at, error) in retries.items()],
            )

    def requeue_failed(self) -> int:
        """Failed entries back to pending (after fixing the cause, e.g. creating the queue)."""
        with self._transaction() as cursor:
            cursor.execute(
                f"UPDATE {TABLE} SET state = '{PENDING}', next_attempt_at = created_at "
                f"WHERE state = '{FAILED}'"
            )
            return int(cursor.rowcount)

    def purge_sent(self, before: float, limit: int | None = None) -> int:
        """Delete sent entries older than ``before`` (the worker's run record keeps the rest):
        at most ``limit`` of them when given, so one purge never holds the table long."""
        p = self._mark()
        with self._transaction() as cursor:
            if limit is None:
                cursor.execute(
                    f"DELETE FROM {TABLE} WHERE state = '{SENT}' AND sent_at < {p}", (before,)
                )
            else:
                cursor.execute(
                    f"DELETE FROM {TABLE} WHERE id IN (SELECT id FROM {TABLE} "
                    f"WHERE state = '{SENT}' AND sent_at < {p} LIMIT {p})",
                    (before, int(limit)),
                )
            return int(cursor.rowcount)

    def pending(self, now: float) -> tuple[int, float]:
        """(depth, oldest age in seconds): the partial index answers it."""
        with self._transaction() as cursor:
            cursor.execute(
                f"SELECT COUNT(*), MIN(created_at) FROM {TABLE} WHERE state = '{PENDING}'"
            )
            count, oldest = cursor.fetchone()
        return int(count), max(0.0, now - float(oldest)) if oldest is not None else 0.0

    def status(self, now: float, failed_limit: int = 50) -> Status:
        with self._transaction() as cursor:
            cursor.execute(
                f"SELECT state, COUNT(*), MIN(created_at), "
                f"SUM(CASE WHEN attempts > 0 THEN 1 ELSE 0 END) FROM {TABLE} GROUP BY state"
            )
            counts = {row[0]: (int(row[1]), row[2], int(row[3] or 0)) for row in cursor}
            cursor.execute(
                f"SELECT id, task_name, attempts, last_error FROM {TABLE} "
                f"WHERE state = '{FAILED}' ORDER BY created_at LIMIT {int(failed_limit)}"
            )
            failed = [Failed(r[0], r[1], int(r[2]), r[3] or "") for r in cursor.fetchall()]
        depth, oldest, retrying = counts.get(PENDING, (0, None, 0))
        return Status(
            depth=depth,
            oldest_age=max(0.0, now - float(oldest)) if oldest is not None else 0.0,
            sent=counts.get(SENT, (0, None, 0))[0],
            failed=failed,
            retrying=retrying,
            failed_total=counts.get(FAILED, (0, None, 0))[0],
        )

    def _skip_locked(self) -> str:
        return ""


def _mapping(cursor: Any, row: Any) -> dict[str, Any]:
    if isinstance(row, Mapping):
        return dict(row)
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


class SQLiteOutbox(SQLOutbox):
    dialect = "sqlite"

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        # Entries hold payloads: a new file is made 0600. An existing one is usually the
        # application's database, whose mode is its choice; it (and a journal SQLite would
        # roll back into it) is used only when it is this user's, never through a link.
        if path != ":memory:":
            file = Path(path)
            if not os.path.lexists(file):
                private_files.create_private_file(file)
            for suffix in ("", *private_files.COMPANIONS, "-journal"):
                private_files.check_own(Path(f"{file}{suffix}"))
        # Autocommit mode, transactions begun explicitly: BEGIN IMMEDIATE takes the write lock
        # before the claim's SELECT, so two relays never read the same due entries.
        # One thread at a time uses it, not always the opening one (``relay --follow``).
        self._conn = sqlite3.connect(
            path, timeout=timeout, isolation_level=None, check_same_thread=False
        )

    def _mark(self) -> str:
        return "?"

    @contextmanager
    def _transaction(self, immediate: bool = False) -> Iterator[sqlite3.Cursor]:
        cursor = self._conn.cursor()
        cursor.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
        try:
            yield cursor
        except BaseException:
            self._conn.rollback()
            raise
        self._conn.commit()

    def close(self) -> None:
        self._forget()
        self._conn.close()


class PostgresOutbox(SQLOutbox):
    dialect = "postgresql"

    def __init__(self, url: str) -> None:
        import psycopg  # noqa: PLC0415 - the postgres extra, needed only here.
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

        self._psycopg = psycopg
        self._conninfo, self._schema = _split_schema(url)
        try:
            conninfo_to_dict(self._conninfo)
        except psycopg.Error as exc:
            # libpq's message quotes the token it could not read: a password, maybe.
            raise ConfigurationError(
                f"outbox URL {shown_url(url)!r}: {scrubbed(str(exc).strip(), url)}"
            ) from None
        self._listener: Any = None
        self._conn = self._connect()

    def _connect(self) -> Any:
        conn = self._psycopg.connect(self._conninfo, autocommit=True)
        if self._schema:
            conn.execute(f'SET search_path TO "{self._schema}"')
        return conn

    def _connection(self) -> Any:
        """The relay's connection, opened again when the server dropped it (a restart, a
        failover, an idle-connection reaper): else every later round would fail on it."""
        if self._conn.closed or self._conn.broken:
            self._conn.close()
            self._conn = self._connect()
        return self._conn

    def _mark(self) -> str:
        return "%s"

    def _skip_locked(self) -> str:
        return " FOR UPDATE SKIP LOCKED"

    @contextmanager
    def _transaction(self, immediate: bool = False) -> Iterator[Any]:
        conn = self._connection()
        with conn.transaction(), conn.cursor() as cursor:
            yield cursor

    def migrate(self) -> None:
        if self._schema:
            self._connection().execute(f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"')
        super().migrate()

    def wait(self, timeout: float) -> bool:
        """LISTEN tasklease_outbox: an enqueue's NOTIFY arrives when its transaction commits.
        A listener the server dropped is opened again at the next wait; until then this
        waits ``timeout`` and says True (a NOTIFY may have been missed: look)."""
        try:
            if self._listener is None:
                self._listener = self._psycopg.connect(self._conninfo, autocommit=True)
                self._listener.execute(f"LISTEN {CHANNEL}")
            for _ in self._listener.notifies(timeout=timeout, stop_after=1):
                return True
        except self._psycopg.Error:
            if self._listener is not None:
                self._listener.close()
            self._listener = None
            time.sleep(timeout)
            return True
        return False

    def close(self) -> None:
        self._forget()
        if self._listener is not None:
            self._listener.close()
        self._conn.close()


def _split_schema(url: str) -> tuple[str, str | None]:
    """``?schema=NAME`` (as the Postgres store takes it, and checked as it checks it: the
    name goes into SQL) is ours, not libpq's."""
    conninfo, ours = split_options(url, {"schema"})
    schema = next((value for _, value in ours), None)
    return conninfo, None if schema is None else checked_schema(schema)


def open_outbox(url: str) -> OutboxDB:
    """``sqlite:///PATH`` (``sqlite:////abs/path``), ``postgresql://...[?schema=NAME]`` or
    ``firestore://?collection=tasklease_outbox&database=(default)&project=P`` or
    ``spanner://projects/P/instances/I/databases/D``."""
    if url.startswith("sqlite:///"):
        return SQLiteOutbox(url[len("sqlite:///") :])
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresOutbox(url)
    if url.startswith("firestore://"):
        from tasklease.outbox.firestore_db import FirestoreOutbox  # noqa: PLC0415 - optional.

        return FirestoreOutbox.from_url(url)
    if url.startswith("spanner://"):
        from tasklease.outbox.spanner_db import SpannerOutbox  # noqa: PLC0415 - optional.

        return SpannerOutbox.from_url(url)
    raise ValueError(
        f"outbox URL {shown_url(url)!r}: use sqlite:///PATH, postgresql://..., "
        "firestore://?collection=... or spanner://projects/P/instances/I/databases/D"
    )
