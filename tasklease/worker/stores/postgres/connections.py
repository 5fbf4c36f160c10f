"""The Postgres store's connections: a pool per process (connections must not cross a fork),
opened lazily, the schema migrated on first use, and every call bounded, its failures as
:class:`StoreUnavailable`.

Bounds: ``statement_timeout`` on the server, waiting for a pooled connection by
``pool_timeout``, and a watchdog (:mod:`~tasklease.worker.stores.postgres.watchdog`) that
cuts a call the server does not answer at all (frozen, unreachable).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool, PoolTimeout

from tasklease.errors import StoreUnavailable
from tasklease.plumbing.per_process import PerProcess
from tasklease.plumbing.url_secrets import scrubbed
from tasklease.worker.stores.postgres.diagnosis import why_no_connection
from tasklease.worker.stores.postgres.group_commit import StatementBatcher
from tasklease.worker.stores.postgres.options import Options
from tasklease.worker.stores.postgres.schema import migrate
from tasklease.worker.stores.postgres.watchdog import CallTimedOut, Watchdog, WatchedConnection

__all__ = ["PostgresConnections", "Process"]

_T = TypeVar("_T")


@dataclass
class Process:
    """What one process holds: its pool, its batches and its watchdog."""

    pool: ConnectionPool[WatchedConnection]
    claims: StatementBatcher  # Its threads' claims, committed together; and their finishes.
    finishes: StatementBatcher
    watchdog: Watchdog = field(default_factory=Watchdog)
    ready: bool = False  # The schema is migrated.


class PostgresConnections:
    """The pooled, bounded connections to ``conninfo`` (libpq, already with the options'
    settings). ``configure`` runs on each new connection; ``on_new_process`` when a process
    (a forked child, or the first use) starts its own pool."""

    def __init__(
        self,
        conninfo: str,
        options: Options,
        *,
        configure: Callable[[Connection[Any]], None],
        on_new_process: Callable[[], None],
    ) -> None:
        self.conninfo = conninfo
        self.options = options
        self._configure = configure
        self._on_new_process = on_new_process
        self._process = PerProcess(self._start_process)

    def process(self) -> Process:
        """This process's pool and batches (made on first use)."""
        return self._process.get()

    def call(self, action: str, work: Callable[[Connection[Any]], _T]) -> _T:
        """``work`` on a pooled connection, bounded; every failure is StoreUnavailable. A
        connection found dead (the server restarted since) is replaced once, and the pool's
        idle connections are checked then. A retried ``work`` may find its own write landed:
        every caller recognises it by the attempt id or the rules."""
        timeout = self.options.call_timeout
        for attempt in range(2):
            process = self.ready_process()
            used: Connection[Any] | None = None
            try:
                with (
                    process.pool.connection(timeout=self.options.pool_timeout) as used,
                    process.watchdog.bounded(used, timeout),
                ):
                    return work(used)
            except CallTimedOut as exc:
                raise self.unavailable_error(
                    action, f"the server did not answer within {timeout:g}s"
                ) from exc
            except PoolTimeout as exc:
                raise self.no_connection_error(action, exc) from exc
            except psycopg.OperationalError as exc:
                if attempt == 0 and used is not None and used.broken:
                    # The server restarted since: the pool's idle connections are dead too.
                    with contextlib.suppress(psycopg.Error, PoolTimeout):
                        process.pool.check()
                    continue
                raise self.unavailable_error(action, str(exc)) from exc
            except psycopg.Error as exc:
                raise self.unavailable_error(action, str(exc)) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def no_connection_error(self, action: str, waited: PoolTimeout) -> StoreUnavailable:
        why = why_no_connection(self.conninfo, waited, self.options.call_timeout)
        return self.unavailable_error(action, why)

    def unavailable_error(self, action: str, why: str) -> StoreUnavailable:
        why = scrubbed(why, self.conninfo)  # A driver's message may quote the connection.
        return StoreUnavailable(
            f"Postgres store ({self.options.schema}): could not {action}: {why}"
        )

    def ready_process(self) -> Process:
        """This process's pool, the schema migrated."""
        process = self._process.get()
        if not process.ready:
            try:
                with (
                    process.pool.connection(timeout=self.options.pool_timeout) as connection,
                    process.watchdog.bounded(connection, self.options.call_timeout),
                ):
                    migrate(connection, self.options.schema)
            except PoolTimeout as exc:
                raise self.no_connection_error("create its tables", exc) from exc
            except (psycopg.Error, CallTimedOut) as exc:
                raise self.unavailable_error("create its tables", str(exc)) from exc
            process.ready = True
        return process

    def close(self) -> None:
        process = self._process.made_here()
        if process is not None:
            process.pool.close()
        self._process.forget()

    def _start_process(self) -> Process:
        self._on_new_process()
        pool: ConnectionPool[WatchedConnection] = ConnectionPool(
            self.conninfo,
            connection_class=WatchedConnection,
            min_size=self.options.min_size,
            max_size=self.options.max_size,
            open=False,
            timeout=self.options.pool_timeout,
            kwargs={"autocommit": True},
            configure=self._configure,
            name=f"tasklease-{self.options.schema}",
        )
        pool.open(wait=False)
        on = self.options.group_commit
        return Process(pool, StatementBatcher(on), StatementBatcher(on))
