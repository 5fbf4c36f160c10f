"""A transactional step (``ctx.step(name, fn, transactional=True)``): the step's database
writes and its record commit in one transaction of the store, conditional on the attempt
still holding the claim, so they happen exactly once without a downstream key.

``fn`` gets the store's native transaction as its first argument (``fn(tx, *args)``), and
``ctx.transaction`` is the same object while it runs. A raising ``fn`` rolls everything back;
a stale attempt's step is rolled back and refused (``LeaseLost``). Needs a store implementing
:meth:`~tasklease.worker.stores.base.transactional.TransactionalStore.record_step_in_transaction`;
on any other the step is refused before ``fn`` runs.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from tasklease.errors import LeaseLost, StoreUnavailable
from tasklease.worker.core import steps as rules
from tasklease.worker.core.steps import StepRecord
from tasklease.worker.runtime.running import step_call
from tasklease.worker.stores.base.retries import retry_while_unavailable
from tasklease.worker.stores.base.transactional import (
    TRANSACTIONAL_STEP_STORES,
    TransactionalStore,
    records_steps_in_transactions,
)

if TYPE_CHECKING:
    from tasklease.worker.handlers.attempt import Attempt
    from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["AttemptSteps", "run_transactional_step"]


class AttemptSteps(Protocol):
    """What a transactional step reads and counts of its attempt's steps: a
    :class:`~tasklease.worker.handlers.steps.StepRunner`, which calls it."""

    run_id: str
    attempt: Attempt | None
    store: LeaseStore | None
    clock: Callable[[], datetime] | None
    recorded: dict[str, StepRecord]
    ran: int
    transaction_tries: int


def run_transactional_step(
    runner: AttemptSteps,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    loop: asyncio.AbstractEventLoop | None = None,
) -> Any:
    """Run step ``name`` (not recorded yet) as ``fn(tx, *args, **kwargs)`` in the store's
    transaction with its record; return its result as a replay would give it. ``loop``: the
    handler's event loop, on which an async ``fn`` runs (``ctx.astep`` calls this from a
    thread of its own)."""
    store, attempt = runner.store, runner.attempt
    if store is None or attempt is None or not records_steps_in_transactions(store):
        raise rules.StepError(
            f"step {name!r}: transactional=True needs a store that records a step in its own "
            f"transaction ({TRANSACTIONAL_STEP_STORES}); {store!r} does not"
        )
    assert isinstance(store, TransactionalStore)  # records_steps_in_transactions said so.
    clock = runner.clock or (lambda: datetime.now().astimezone())
    written: list[StepRecord] = []
    tries = 0

    def step_work(transaction: Any) -> StepRecord:
        nonlocal tries
        tries += 1  # More than once where the database runs an aborted transaction again.
        # Checked again here, not only before the store call: the attempt may have stalled,
        # or its call been held up, until after another attempt took the run over and
        # recorded this step. Its transaction would roll back, but ``fn`` would have run.
        attempt.check_lease()
        # ctx.transaction, and no step nested in this one, for this step's own execution:
        # its coroutine's task, started from this thread, copies its context. The step call
        # is fresh at each try: its enqueues name the first try's tasks.
        with attempt.in_step_transaction(transaction), step_call(name):
            result = fn(transaction, *args, **kwargs)
            if inspect.isawaitable(result):
                if loop is None:
                    _close(result)
                    raise rules.StepError(
                        f"step {name!r}: its function is async: use `await ctx.astep(...)`"
                    )
                result = asyncio.run_coroutine_threadsafe(_awaited(result), loop).result()
        result_json = rules.encode_result(name, result)  # Raised here: rolled back.
        step = StepRecord(name, result_json, attempt.attempt_id, clock(), len(result_json.encode()))
        written.append(step)
        return step

    try:
        outcome = store.record_step_in_transaction(
            runner.run_id, attempt.attempt_id, step_work, clock
        )
    except StoreUnavailable:
        runner.transaction_tries += tries
        # The commit's outcome may be unknown: the record tells whether it landed.
        record = retry_while_unavailable(lambda: store.get(runner.run_id), attempt.timing.sleep)
        landed = rules.steps_of(record).get(name)
        if landed is None or landed.attempt_id != attempt.attempt_id:
            raise
        written.append(landed)
    else:
        runner.transaction_tries += tries
        if not outcome.held:
            attempt.mark_lease_lost()
            raise LeaseLost(
                f"run {runner.run_id}: transactional step {name!r} of attempt "
                f"{attempt.attempt_id} was rolled back: another attempt holds the run now"
            )
    step = written[-1]
    runner.recorded[name] = step
    runner.ran += 1
    return step.result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:  # A coroutine never awaited: no "never awaited" warning.
        close()
