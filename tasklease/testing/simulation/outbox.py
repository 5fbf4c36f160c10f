"""The outbox workload: simulated users whose own transactions, on the store's database, stage
an enqueue in the outbox (the real ``enqueue(..., transaction=)``) and commit or roll back;
and the real :class:`~tasklease.outbox.relay.Relay` draining the outbox to the simulated
queue, as actors of a relay instance the kill and stall faults reach like any worker's.

The relay's rounds start when a user commits (a following relay woken by the commit) and
every :data:`SWEEP_EVERY` virtual seconds (the sweeper, which also picks up the entries of a
relay killed mid-batch once their claim ran out). Each claim and each mark pauses: the
relay's database calls are where a kill lands between claiming an entry and creating its task.

SQLite stores only: the user's transaction is a ``sqlite3`` connection to the store's file.
"""

from __future__ import annotations

import random
import sqlite3
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta

from tasklease.outbox.db import SQLiteOutbox
from tasklease.outbox.entries import Entry, Undecodable
from tasklease.outbox.relay import Relay
from tasklease.producer import Producer
from tasklease.testing.simulation.engine import Engine, Instance
from tasklease.testing.simulation.faults import Trace
from tasklease.testing.simulation.history import History, OutboxTransaction
from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["OUTBOX_HANDLER", "SWEEP_EVERY", "SimulatedOutbox", "outbox_path"]

OUTBOX_HANDLER = "outboxed"
SWEEP_EVERY = 30.0
# Staging stamps an entry with the real clock (time.time()). The relay's clock is virtual
# time shifted past any real time, so every committed entry is due at once, and its claims'
# leases and backoffs run on virtual time.
_RELAY_CLOCK_SHIFT = 1.0e10


class _RemoteOutbox(SQLiteOutbox):
    """The relay's outbox, each call a round trip: the relay's actor pauses after a claim and
    before a mark."""

    def __init__(self, path: str, engine: Engine, rng: random.Random) -> None:
        super().__init__(path)
        self.engine, self.rng = engine, rng

    def claim(self, limit: int, now: float, lease: float) -> list[Entry | Undecodable]:
        claimed = super().claim(limit, now, lease)
        self.engine.pause(self.rng.uniform(0.001, 0.02))
        return claimed

    def mark_sent(self, ids: Sequence[str], now: float) -> None:
        self.engine.pause(self.rng.uniform(0.001, 0.02))
        super().mark_sent(ids, now)


class SimulatedOutbox:
    """The outbox in a SQLite store's file, its users and its relay (see the module)."""

    def __init__(
        self,
        path: str,
        engine: Engine,
        *,
        history: History,
        trace: Trace,
        rng: random.Random,
        producer: Producer,
        running: Callable[[], bool],
    ) -> None:
        self.path, self.engine, self.history, self.trace = path, engine, history, trace
        self.producer, self.running = producer, running
        self.db = _RemoteOutbox(path, engine, rng)
        self.db.migrate()
        with sqlite3.connect(path, isolation_level=None) as connection:
            connection.execute("CREATE TABLE IF NOT EXISTS sim_orders (key TEXT PRIMARY KEY)")
        # One entry per claim: the producer sends a batch on a pool of threads, whose order
        # of creates the seed would not decide.
        self.relay = Relay(
            self.db,
            producer,
            batch=1,
            clock=lambda: _RELAY_CLOCK_SHIFT + engine.now,
            keep_sent=None,
        )
        self.instance: Instance | None = None
        self.instances = 0

    def start(self) -> None:
        """The sweeper's first round; each schedules the next while the simulation runs."""
        self.engine.at(SWEEP_EVERY, self._sweep)

    def user_transaction(self, key: str, commit: bool) -> None:
        """A user's transaction: its own row and one staged enqueue, then commit or roll
        back (called in a user's actor; nothing in it pauses, so no store call interleaves)."""
        connection = sqlite3.connect(self.path, isolation_level=None)
        try:
            connection.execute("BEGIN")
            result = self.producer.enqueue(
                OUTBOX_HANDLER, {"steps": 1}, key=key, transaction=connection
            )
            connection.execute("INSERT INTO sim_orders (key) VALUES (?)", (key,))
            if commit:
                connection.commit()
            else:
                connection.rollback()
        finally:
            connection.close()
        self.history.outbox.append(OutboxTransaction(self.engine.now, result.task_id, commit))
        self.trace.note(f"outbox {key} {'commit' if commit else 'rollback'}")
        if commit:
            self.engine.at(0.01, self._round)

    def _sweep(self) -> None:
        if not self.running():
            return
        self._round()
        self.engine.at(SWEEP_EVERY, self._sweep)

    def _round(self) -> None:
        if self.instance is None or self.instance.killed:
            self.instances += 1
            self.instance = Instance(f"relay{self.instances}", timedelta(0))
        self.engine.spawn(f"{self.instance.name}:drain", self.instance, self._drain)

    def _drain(self) -> None:
        self.relay.drain()

    def close(self) -> None:
        self.db.close()


def outbox_path(store: LeaseStore) -> str | None:
    """The file of ``store`` the outbox workload's users and relay share: SQLite stores
    (their subclasses too) only, else None."""
    # Asking sys.modules never imports a store's module: a store is an instance of its class
    # only once that module was imported.
    loaded = sys.modules.get("tasklease.worker.stores.sqlite.store")
    store_class = getattr(loaded, "SqliteStore", None)
    if store_class is None or not isinstance(store, store_class):
        return None
    return str(store.path)
