"""Shared by the Postgres group-commit tests: claims sent from threads of their own while a
run's row is locked by another transaction, and a wait for a condition to come true."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from tasklease.errors import StoreUnavailable
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support import postgres as postgres_support
from tests.support.helpers import T0, claim_request

# The store's statements waiting on a lock (its connections say application_name tasklease).
LOCK_WAITERS = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tasklease' "
    "AND wait_event_type = 'Lock'"
)


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


class ThreadedClaims:
    """Claims of ``store``, each sent from a thread of its own; ``outcomes`` maps each
    attempt to its verdict, or to the ``StoreUnavailable`` it raised."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.outcomes: dict[str, Any] = {}

    def start(self, run: str, attempt: str) -> threading.Thread:
        thread = threading.Thread(target=self._claim, args=(run, attempt))
        thread.start()
        return thread

    def _claim(self, run: str, attempt: str) -> None:
        try:
            self.outcomes[attempt] = self.store.claim(claim_request(run, attempt), T0).verdict
        except StoreUnavailable as exc:
            self.outcomes[attempt] = exc


@contextmanager
def row_locked(cluster: postgres_support.Cluster, schema: str, run_id: str) -> Iterator[None]:
    """An update of ``run_id``'s row in flight on a connection of its own, rolled back at the
    end: until then a claim of that run waits for it (ON CONFLICT)."""
    with psycopg.connect(cluster.url()) as blocker:
        blocker.execute(f"UPDATE {schema}.runs SET version = version WHERE run_id = %s", (run_id,))
        yield
        blocker.rollback()
