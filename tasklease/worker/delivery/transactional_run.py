"""How the executor runs a ``transactional=True`` handler: inside the store's own transaction,
whose commit also writes the run's completion record, conditional on this attempt still
holding the claim (:class:`~tasklease.worker.stores.base.transactional.TransactionalStore`).

The handler's writes through ``ctx.transaction`` and the record commit together or not at
all, so a crash anywhere leaves either both (a retry answers from the record) or neither (a
retry runs the handler again, on a database without its effects).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from tasklease.errors import LeaseLost, PermanentFailure, StoreUnavailable
from tasklease.worker.core import decisions
from tasklease.worker.core.identity import Kind
from tasklease.worker.core.outcome import Outcome
from tasklease.worker.core.records import RunStatus
from tasklease.worker.delivery import lease
from tasklease.worker.delivery.attempt import Attempt
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.delivery.store_retries import retry_while_unavailable
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import HandlerSpec
from tasklease.worker.handlers.running import current_call, handler_call
from tasklease.worker.observe import telemetry
from tasklease.worker.observe.logs import note_error
from tasklease.worker.runtime.event_loop import HANDLER_LOOP, LoopNotStarted
from tasklease.worker.stores.base.transactional import TransactionalStore, TransactionOutcome

if TYPE_CHECKING:
    from tasklease.worker.delivery.executor import Executor

__all__ = ["run_in_transaction"]


class _Unserialisable(Exception):
    """The handler's result is not JSON: raised inside the transaction, so it rolls back."""


def run_in_transaction(
    executor: Executor,
    spec: HandlerSpec,
    ctx: TaskContext,
    live: Attempt,
    *,
    payload: Any,
    body: bytes,
    log: dict[str, Any],
) -> Reply:
    """Run ``spec``'s handler for the claimed attempt ``live`` in the store's transaction,
    and answer as the executor does for any handler. ``log`` gets ``transaction_tries``."""
    store = executor.store
    if not isinstance(store, TransactionalStore):  # create_app refuses it at start.
        raise TypeError(f"{store!r} cannot run the transactional handler {spec.name}")
    tries = 0

    def work(transaction: Any) -> str | None:
        nonlocal tries
        tries += 1
        log["transaction_tries"] = tries
        call = current_call()
        if call is not None:  # A try again: its enqueues name the tasks of the first.
            call.restart()
        live.transaction = transaction
        try:
            result = spec.function(payload, ctx) if spec.kind is Kind.TASK else spec.function(ctx)
            while inspect.isawaitable(result):  # async def, or returning one: awaited.
                result = HANDLER_LOOP.run(result)
        finally:
            live.transaction = None
        try:
            return decisions.serialize_result(result)
        except ValueError as exc:
            raise _Unserialisable(str(exc)) from exc

    try:
        with (
            executor.lease_keeper.kept(live, spec.lease, keep_for=spec.retention),
            telemetry.step("handler"),
            handler_call(ctx.run_id, spec.name, ctx.continuation),
        ):
            outcome = store.complete_in_transaction(
                live.run_id, live.attempt_id, work, executor.clock, keep_for=spec.retention
            )
    except (lease.KeeperNotStarted, LoopNotStarted) as exc:  # The handler never ran.
        executor.give_back(live, str(exc), count=False)
        return Reply.of(Outcome.UNAVAILABLE, str(exc), live.run_id)
    except PermanentFailure as exc:  # Rolled back: nothing it wrote was kept.
        return executor.fail(live, f"PermanentFailure: {exc}", body)
    except _Unserialisable as exc:  # Rolled back too; a retry would get the same result.
        return executor.fail(live, str(exc), body)
    except LeaseLost as exc:
        executor.give_back(live, f"LeaseLost: {exc}")
        return Reply.of(Outcome.LOST_CLAIM, str(exc), live.run_id)
    except StoreUnavailable as exc:
        return _commit_unknown(executor, live, exc)
    except BaseException as exc:  # SystemExit too: sys.exit(), argparse's error().
        note_error(exc)  # Its stack trace goes into the request's one log line.
        error = f"{type(exc).__name__}: {exc}"
        reply = executor.finish(
            live,
            lambda: store.release(
                live.run_id, live.attempt_id, error, executor.clock, keep_for=spec.retention
            ),
            Reply.of(
                Outcome.RELEASED,
                f"handler raised {type(exc).__name__}; rolled back and released for a retry",
                live.run_id,
            ),
        )
        if isinstance(exc, KeyboardInterrupt):
            raise  # The process is being stopped: its run was given back first.
        return reply
    log["transaction_tries"] = outcome.tries
    return _answer(outcome, live)


def _answer(outcome: TransactionOutcome, live: Attempt) -> Reply:
    if not outcome.held:
        # Another attempt took over after this one's lease expired: it owns the record now.
        return Reply.of(
            Outcome.LOST_CLAIM,
            "the lease was taken over by another attempt; the transaction was rolled back "
            "and nothing the handler wrote in it was kept",
            live.run_id,
        )
    return Reply.of(Outcome.PROCESSED, "processed", live.run_id, result_json=outcome.result_json)


def _commit_unknown(executor: Executor, live: Attempt, error: StoreUnavailable) -> Reply:
    """The database failed during the transaction: its record tells whether it committed."""
    try:
        record = retry_while_unavailable(lambda: executor.store.get(live.run_id))
    except StoreUnavailable as exc:
        # In progress until its lease expires; then a retry finds the record or runs again.
        return Reply.of(
            Outcome.UNRECORDED,
            f"the transaction's outcome is unknown ({error}); the record unreadable: {exc}",
            live.run_id,
        )
    if decisions.finished_by(record, live.attempt_id, RunStatus.COMPLETED):
        assert record is not None
        return Reply.of(Outcome.PROCESSED, "processed", live.run_id, result_json=record.result_json)
    executor.give_back(live, f"the transaction did not commit: {error}")
    return Reply.of(
        Outcome.UNAVAILABLE, f"lease store unavailable; rolled back: {error}", live.run_id
    )
