"""The ``tasklease_outbox`` table, for SQLite and Postgres (``tasklease outbox migrate``);
Spanner's is in :mod:`tasklease.outbox.spanner`.

Times are seconds since the epoch (double precision) so one relay serves both dialects.
``next_attempt_at`` is when the relay may next try an entry: its commit time at first, then a
back-off after a transient error, or the end of a relay's claim on it.
"""

from __future__ import annotations

from tasklease.outbox.entries import TABLE

_COMMON = """\
    id TEXT PRIMARY KEY,
    task_name TEXT NOT NULL,
    queue TEXT NOT NULL,
    task_id TEXT NOT NULL,
    url TEXT NOT NULL,
    body {blob} NOT NULL,
    headers TEXT NOT NULL,
    service_account TEXT,
    audience TEXT,
    schedule_time {real},
    dispatch_deadline {real},
    trace_context TEXT,
    created_at {real} NOT NULL,
    next_attempt_at {real} NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    sent_at {real}"""

DIALECTS = ("sqlite", "postgresql", "spanner")


def statements(dialect: str) -> list[str]:
    """The statements creating the table and its index (idempotent: IF NOT EXISTS)."""
    if dialect == "spanner":
        from tasklease.outbox import spanner  # noqa: PLC0415

        return spanner.statements()
    if dialect == "sqlite":
        columns = _COMMON.format(blob="BLOB", real="REAL")
    elif dialect in ("postgresql", "postgres"):
        columns = _COMMON.format(blob="BYTEA", real="DOUBLE PRECISION")
    else:
        raise ValueError(f"no outbox DDL for {dialect!r}: use one of {', '.join(DIALECTS)}")
    return [
        f"CREATE TABLE IF NOT EXISTS {TABLE} (\n{columns}\n)",
        # The relay reads pending entries oldest first; sent ones stay out of the index.
        f"CREATE INDEX IF NOT EXISTS {TABLE}_pending ON {TABLE} (created_at) "
        "WHERE state = 'pending'",
    ]


def script(dialect: str) -> str:
    """The SQL as one script, for users who run their own migrations (Alembic, Django)."""
    return "".join(f"{statement};\n" for statement in statements(dialect))
