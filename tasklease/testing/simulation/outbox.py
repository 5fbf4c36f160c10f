"""The outbox workload: simulated users whose own transactions, on the store's database, stage
an enqueue in the outbox (the real ``enqueue(..., transaction=)``) and commit or roll back;
and the real :class:`~tasklease.outbox.relay.Relay` draining the outbox to the simulated
queue, as actors of a relay instance the kill and stall faults reach like any worker's.

The relay's rounds start when a user commits (a following relay woken by the commit) and
every :data:`SWEEP_EVERY` virtual seconds (the sweeper, which also picks up the entries of a
relay killed mid-batch once their claim ran out). Each claim and each mark pauses: the
relay's database calls are where a kill lands between claiming an entry and creating its task.

The database is the store's own, as each kind of store's world
(:mod:`~tasklease.testing.simulation.outbox_worlds`) makes it: SQLite, Postgres, Firestore
and Spanner stores, each with the real outbox tasklease has for that database.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from tasklease.outbox.relay import Relay
from tasklease.producer import Producer
from tasklease.testing.simulation.engine import Engine, Instance
from tasklease.testing.simulation.faults import Trace
from tasklease.testing.simulation.history import History, OutboxTransaction
from tasklease.testing.simulation.outbox_worlds import OUTBOX_HANDLER, OutboxWorld

__all__ = ["OUTBOX_HANDLER", "SWEEP_EVERY", "SimulatedOutbox"]

SWEEP_EVERY = 30.0
# Staging stamps an entry with the real clock (time.time()). The relay's clock is virtual
# time shifted past any real time, so every committed entry is due at once, and its claims'
# leases and backoffs run on virtual time.
_RELAY_CLOCK_SHIFT = 1.0e10


class SimulatedOutbox:
    """The outbox in a store's database (``world``), its users and its relay (see the
    module)."""

    def __init__(
        self,
        world: OutboxWorld,
        engine: Engine,
        *,
        history: History,
        trace: Trace,
        producer: Producer,
        running: Callable[[], bool],
    ) -> None:
        self.world, self.engine, self.history, self.trace = world, engine, history, trace
        self.running = running
        # One entry per claim: the producer sends a batch on a pool of threads, whose order
        # of creates the seed would not decide.
        self.relay = Relay(
            world.outbox,
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
        result = self.world.user_transaction(key, commit)
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
        self.world.close()
