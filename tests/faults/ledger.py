"""The crash-after-effect scenario's handlers and its accounts table, per store.

The effect is a plain ``UPDATE accounts SET balance = balance + 1`` of the task's own row:
no key, not idempotent, so a second application shows as a balance of 2. ``ledger_tx`` runs
it through ``ctx.transaction`` (``transactional=True``); ``ledger_plain``, the control, runs
the same statement on a connection of its own that commits at once. Both sleep before and
after the effect (times from the payload), so kills land on either side of it, and note each
effect in ``TASKLEASE_FAULTS_EFFECTS`` (a line per statement run, committed or not).
``ledger_steps`` runs the statement in three transactional durable steps
(``ctx.step(..., transactional=True)``), each noted as ``<key>/step-<i>``: every balance
must end at 3.

A store joins the scenario with an :class:`Accounts` for its backend (``ACCOUNTS``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from tasklease import protocol
from tasklease.worker import Router, TaskContext
from tasklease.worker.stores import SqliteStore
from tasklease.worker.stores.postgres.options import Options
from tasklease.worker.stores.postgres.store import PostgresStore

ENV_EFFECTS = "TASKLEASE_FAULTS_EFFECTS"
LEASE = timedelta(seconds=2)


@dataclass(frozen=True)
class Accounts:
    """How one backend keeps the scenario's accounts table next to the store's records."""

    create: Callable[[str, list[str]], None]  # (store URL, keys): one row per key, balance 0.
    balances: Callable[[str], dict[str, int]]
    connect: Callable[[str], Any]  # A DB-API connection of its own that commits each statement.
    bump: Callable[[Any, str, str], None]  # (connection or transaction, store URL, key).


def _sqlite_path(url: str) -> str:
    path = url.partition("://")[2]
    return path[1:] if path.startswith("/") else path


def _sqlite_create(url: str, keys: list[str]) -> None:
    store = SqliteStore(_sqlite_path(url))
    store.get("warm-up")  # The store creates its file (0600) and tables first.
    store.close()
    with sqlite3.connect(_sqlite_path(url)) as connection:
        connection.execute("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER)")
        connection.executemany("INSERT INTO accounts VALUES (?, 0)", [(k,) for k in keys])


def _sqlite_balances(url: str) -> dict[str, int]:
    with sqlite3.connect(_sqlite_path(url)) as connection:
        return dict(connection.execute("SELECT id, balance FROM accounts").fetchall())


def _sqlite_connect(url: str) -> sqlite3.Connection:
    return sqlite3.connect(_sqlite_path(url), timeout=30, isolation_level=None)


def _sqlite_bump(connection: sqlite3.Connection, url: str, key: str) -> None:
    connection.execute("UPDATE accounts SET balance = balance + 1 WHERE id = ?", (key,))


def _pg(url: str) -> tuple[str, str]:
    conninfo, options = Options.from_url(url)
    return conninfo, options.schema


def _pg_create(url: str, keys: list[str]) -> None:
    store = PostgresStore.from_url(url)
    store.get("warm-up")  # Creates the store's schema, where the accounts live too.
    store.close()
    conninfo, schema = _pg(url)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{schema}".accounts (id text PRIMARY KEY, balance int)')
        with connection.cursor() as cursor:
            cursor.executemany(
                f'INSERT INTO "{schema}".accounts VALUES (%s, 0)', [(k,) for k in keys]
            )


def _pg_balances(url: str) -> dict[str, int]:
    conninfo, schema = _pg(url)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        rows = connection.execute(f'SELECT id, balance FROM "{schema}".accounts').fetchall()
    return {str(k): int(v) for k, v in rows}


def _pg_connect(url: str) -> Any:
    return psycopg.connect(_pg(url)[0], autocommit=True)


def _pg_bump(connection: Any, url: str, key: str) -> None:
    schema = _pg(url)[1]
    connection.execute(
        f'UPDATE "{schema}".accounts SET balance = balance + 1 WHERE id = %s', (key,)
    )


ACCOUNTS = {
    "sqlite": Accounts(_sqlite_create, _sqlite_balances, _sqlite_connect, _sqlite_bump),
    "postgres": Accounts(_pg_create, _pg_balances, _pg_connect, _pg_bump),
}


def accounts_for(url: str) -> Accounts:
    """The accounts of the store ``url`` names (a KeyError for a store not in the scenario)."""
    scheme = url.partition(":")[0]
    return ACCOUNTS["postgres" if scheme in ("postgresql", "postgres") else scheme]


_own = threading.local()


def _note(key: str, ctx: TaskContext) -> None:
    line = f"{os.getpid()} {key} {ctx.attempt_id} {ctx.fencing_token} {ctx.run_id}\n"
    with Path(os.environ[ENV_EFFECTS]).open("a") as out:
        out.write(line)


def register(router: Router) -> None:
    """Register ``ledger_tx``, ``ledger_plain`` and ``ledger_steps`` on the fault server's
    router."""
    url = os.environ.get(protocol.ENV_STORE, "")

    def effect(payload: dict[str, Any], ctx: TaskContext, through: Any) -> dict[str, Any]:
        key = str(payload["key"])
        time.sleep(float(payload.get("before", 0)))
        accounts_for(url).bump(through, url, key)
        _note(key, ctx)
        time.sleep(float(payload.get("after", 0)))
        return {"pid": os.getpid(), "token": ctx.fencing_token}

    @router.task("ledger_tx", lease=LEASE, transactional=True)
    def ledger_tx(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        return effect(payload, ctx, ctx.transaction)

    @router.task("ledger_plain", lease=LEASE)
    def ledger_plain(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        if getattr(_own, "pid", None) != os.getpid():
            _own.connection, _own.pid = accounts_for(url).connect(url), os.getpid()
        return effect(payload, ctx, _own.connection)

    @router.task("ledger_steps", lease=LEASE)
    def ledger_steps(payload: dict[str, Any], ctx: TaskContext) -> list[int]:
        key = str(payload["key"])
        share = 1 / STEPS

        def step(tx: Any, name: str) -> int:
            time.sleep(float(payload.get("before", 0)) * share)
            accounts_for(url).bump(tx, url, key)
            _note(f"{key}/{name}", ctx)
            time.sleep(float(payload.get("after", 0)) * share)
            return os.getpid()

        return [ctx.step(f"step-{i}", step, f"step-{i}", transactional=True) for i in range(STEPS)]


STEPS = 3  # ledger_steps' transactional steps.
