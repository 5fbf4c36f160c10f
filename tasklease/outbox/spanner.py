"""The outbox in Spanner: entries staged through the caller's ``Transaction`` (inside
``database.run_in_transaction``), in the table ``tasklease_outbox`` of the caller's database.

Staging reads the entries' keys through the transaction (one read, which begins it inline
when it is the first statement), then buffers one ``insert`` mutation per new entry: a name
committed before is skipped (``staged=False``, as the SQL outboxes' ``ON CONFLICT DO
NOTHING``), and so is a second enqueue of a name within one transaction. The read locks the
keys, so of two transactions staging one new name Spanner aborts one, whose re-run finds the
other's entry: never two entries, never a failed commit.

Spanner tells no one of a commit. The fast path is the caller's own process: the
transaction's ``commit`` is wrapped so that, once it returns, every following relay of the
process wakes (:mod:`tasklease.outbox.wake`); the sweeper and ``tasklease outbox relay``
cover the rest (a crash between the commit and the relay).

``body`` is BYTES, given to the client base64-encoded (it passes a ``bytes`` value on as
the wire's base64 text, and reads it back so, still encoded). Times are seconds since the
epoch (FLOAT64), as in the SQL table; ``sent_time`` (the commit timestamp of the mark sent)
carries the row deletion policy that drops sent entries after :data:`KEEP_SENT_DAYS`, as the
sweeper's purge does.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from tasklease.outbox import wake
from tasklease.outbox.entries import COLUMNS, PENDING, TABLE, Entry
from tasklease.outbox.errors import NotInTransaction

WRITE_COLUMNS = (*COLUMNS, "state", "attempts")
KEEP_SENT_DAYS = 7  # As the sweeper's ``keep_sent`` default.
_STAGED = "_tasklease_outbox_staged"  # The ids one transaction object has staged.


def statements(table: str = TABLE) -> list[str]:
    """The DDL of the table and its index (each a no-op when present: IF NOT EXISTS)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
    id STRING(MAX) NOT NULL,
    task_name STRING(MAX) NOT NULL,
    queue STRING(MAX) NOT NULL,
    task_id STRING(MAX) NOT NULL,
    url STRING(MAX) NOT NULL,
    body BYTES(MAX) NOT NULL,
    headers STRING(MAX) NOT NULL,
    service_account STRING(MAX),
    audience STRING(MAX),
    schedule_time FLOAT64,
    dispatch_deadline FLOAT64,
    trace_context STRING(MAX),
    created_at FLOAT64 NOT NULL,
    next_attempt_at FLOAT64 NOT NULL,
    state STRING(16) NOT NULL,
    attempts INT64 NOT NULL,
    last_error STRING(MAX),
    sent_at FLOAT64,
    sent_time TIMESTAMP OPTIONS (allow_commit_timestamp = true),
    CONSTRAINT {table}_state CHECK (state IN ('pending', 'sent', 'failed'))
) PRIMARY KEY (id),
ROW DELETION POLICY (OLDER_THAN(sent_time, INTERVAL {KEEP_SENT_DAYS} DAY))""",
        # The relay's claim: due pending entries, earliest due first.
        f"CREATE INDEX IF NOT EXISTS {table}_due ON {table} (state, next_attempt_at)",
    ]


def script(table: str = TABLE) -> str:
    """The DDL as one script (``gcloud spanner databases ddl update --ddl-file``)."""
    return "".join(f"{statement};\n" for statement in statements(table))


def stage(tx: Any, entries: Sequence[Entry], table: str = TABLE) -> list[bool]:
    """Buffer an ``insert`` of each new entry in ``tx``; True for each that is new."""
    if getattr(tx, "committed", None) is not None or getattr(tx, "rolled_back", False):
        raise NotInTransaction(
            "the Spanner Transaction is committed or rolled back already: stage inside the "
            "function given to database.run_in_transaction"
        )
    from google.cloud.spanner_v1 import KeySet  # noqa: PLC0415 - the caller's own Spanner.

    staged: set[str] = getattr(tx, _STAGED, None) or set()
    wanted = sorted({entry.id for entry in entries} - staged)
    found: set[str] = set()
    if wanted:
        keys = KeySet(keys=[[name] for name in wanted])  # type: ignore[no-untyped-call]
        rows = tx.read(table, ("id",), keys)
        found = {row[0] for row in rows}
    new: list[bool] = []
    values: list[list[Any]] = []
    for entry in entries:
        if entry.id in found or entry.id in staged:
            new.append(False)
            continue
        staged.add(entry.id)
        values.append(_values(entry))
        new.append(True)
    if values:
        tx.insert(table, WRITE_COLUMNS, values)
    if not hasattr(tx, _STAGED):
        _nudge_after_commit(tx)
    setattr(tx, _STAGED, staged)
    return new


def _values(entry: Entry) -> list[Any]:
    row = entry.row()
    row["body"] = base64.b64encode(row["body"])
    return [*(row[column] for column in COLUMNS), PENDING, 0]


def _nudge_after_commit(tx: Any) -> None:
    """Wrap ``tx.commit`` (what ``run_in_transaction`` calls): after it returns, the
    following relays of this process relay at once."""
    commit = tx.commit

    def commit_then_nudge(*args: Any, **kwargs: Any) -> Any:
        committed = commit(*args, **kwargs)
        wake.nudge()
        return committed

    tx.commit = commit_then_nudge
