"""The waits workload's users: each signals the run of its lifecycle with the real
``tasklease.signal`` (its :func:`~tasklease.worker.operate.signals.send_signal`, on the
simulation's clock) a seeded number of times, after seeded delays, and notes every call and
its answer in the history.

A user learns its run's id from the history, where the waiting handler notes it at its start
(as a real user would keep the id the run was started under), then waits each delay and sends
its signals one after another: the first with ``{"n": 0}``, a second (a duplicate, with
another payload) with ``{"n": 1}``. A call that raises (the store, or the queue, could not be
reached) is sent again, with the same payload, a few times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from tasklease.errors import TaskleaseError
from tasklease.producer import Producer
from tasklease.testing.simulation.engine import EPOCH, Engine
from tasklease.testing.simulation.faults import Trace
from tasklease.testing.simulation.history import History, SignalCall
from tasklease.worker.operate.signals import send_signal
from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["SIGNAL_TRIES", "SimulatedSignals"]

SIGNAL_TRIES = 5  # Calls of one signal, the first included, while each raises.
RETRY_PAUSE = 2.0  # Virtual seconds before a raised call is sent again (times its number).
POLL_EVERY = 1.0  # How often a user looks for its run's id.
POLL_FOR = 3600.0  # How long it looks before it gives up (its run never started).


class SimulatedSignals:
    """The users of the waits workload, over the simulation's store and producer."""

    def __init__(
        self,
        engine: Engine,
        history: History,
        trace: Trace,
        store: LeaseStore,
        producer: Producer,
        *,
        wait_name: str,
    ) -> None:
        self.engine, self.history, self.trace = engine, history, trace
        self.store, self.producer = store, producer
        self.wait_name = wait_name

    def user(self, lifecycle: str, delays: Sequence[float]) -> Callable[[], None]:
        """What the user of ``lifecycle`` does (run as a user's actor): once its run's id is
        known, send one signal after each of ``delays`` (virtual seconds, each counted from
        the previous signal's answer)."""

        def signals() -> None:
            if not delays:
                return
            run_id = self._run_of(lifecycle)
            if run_id is None:
                return
            for number, delay in enumerate(delays):
                self.engine.sleep(delay)
                self._send(run_id, {"n": number})

        return signals

    def _run_of(self, lifecycle: str) -> str | None:
        waited = 0.0
        while (run_id := self.history.waiters.get(lifecycle)) is None:
            if waited >= POLL_FOR:
                return None
            self.engine.sleep(POLL_EVERY)
            waited += POLL_EVERY
        return run_id

    def _clock(self) -> datetime:
        return EPOCH + timedelta(seconds=self.engine.now)

    def _send(self, run_id: str, payload: dict[str, int]) -> None:
        history, engine = self.history, self.engine
        for number in range(1, SIGNAL_TRIES + 1):
            sent_at = engine.now
            try:
                decision = send_signal(
                    run_id,
                    self.wait_name,
                    payload,
                    store=self.store,
                    producer=self.producer,
                    clock=self._clock,
                    sleep=engine.sleep,
                )
            except TaskleaseError as exc:  # Anything else escapes: the checker's `crashed`.
                error = f"{type(exc).__name__}: {exc}"
                history.signals.append(
                    SignalCall(sent_at, engine.now, run_id, payload, None, error)
                )
                self.trace.note(f"signal {run_id[:12]} {payload} raised")
                engine.sleep(RETRY_PAUSE * number)
                continue
            accepted = decision.outcome.accepted
            history.signals.append(SignalCall(sent_at, engine.now, run_id, payload, accepted))
            self.trace.note(f"signal {run_id[:12]} {payload} {decision.outcome.value}")
            return
