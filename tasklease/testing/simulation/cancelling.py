"""The cancel workload's users: each cancels the run of its lifecycle with the real
cancellation (:func:`~tasklease.worker.operate.cancels.cancel_run`, what ``tasklease.cancel``
calls, on the simulation's clock) after a seeded delay, and notes the call and its answer in
the history.

A user learns its run's id from the history, where the handler notes it at its start (as a
real user would keep the id the run was started under), then waits its delay: none (before
the run's first step), a few seconds (while it runs), a minute or more (while it waits), or
long after it ended. A call that raises (the store could not be reached) is sent again a few
times.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from tasklease.errors import TaskleaseError
from tasklease.testing.simulation.engine import EPOCH, Engine
from tasklease.testing.simulation.faults import Trace
from tasklease.testing.simulation.history import CancelCall, History
from tasklease.worker.operate.cancels import cancel_run
from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["CANCEL_TRIES", "SimulatedCancels"]

CANCEL_TRIES = 5  # Calls of one cancellation, the first included, while each raises.
RETRY_PAUSE = 2.0  # Virtual seconds before a raised call is sent again (times its number).
POLL_EVERY = 0.25  # How often a user looks for its run's id.
POLL_FOR = 3600.0  # How long it looks before it gives up (its run never started).


class SimulatedCancels:
    """The users of the cancel workload, over the simulation's store."""

    def __init__(self, engine: Engine, history: History, trace: Trace, store: LeaseStore) -> None:
        self.engine, self.history, self.trace, self.store = engine, history, trace, store

    def user(self, lifecycle: str, delay: float | None) -> Callable[[], None]:
        """What the user of ``lifecycle`` does (run as a user's actor): once its run's id is
        known, cancel it after ``delay`` virtual seconds (None: never)."""

        def cancels() -> None:
            if delay is None:
                return
            waited = 0.0
            while (run_id := self.history.cancellables.get(lifecycle)) is None:
                if waited >= POLL_FOR:
                    return
                self.engine.sleep(POLL_EVERY)
                waited += POLL_EVERY
            self.engine.sleep(delay)
            self._cancel(run_id)

        return cancels

    def _clock(self) -> datetime:
        return EPOCH + timedelta(seconds=self.engine.now)

    def _cancel(self, run_id: str) -> None:
        history, engine = self.history, self.engine
        for number in range(1, CANCEL_TRIES + 1):
            sent_at = engine.now
            try:
                result = cancel_run(self.store, run_id, "a simulated user", clock=self._clock)
            except TaskleaseError as exc:  # Anything else escapes: the checker's `crashed`.
                error = f"{type(exc).__name__}: {exc}"
                history.cancels.append(CancelCall(sent_at, engine.now, run_id, None, error))
                self.trace.note(f"cancel {run_id[:12]} raised")
                engine.sleep(RETRY_PAUSE * number)
                continue
            history.cancels.append(CancelCall(sent_at, engine.now, run_id, result.accepted))
            self.trace.note(f"cancel {run_id[:12]} {result.outcome.value}")
            return
