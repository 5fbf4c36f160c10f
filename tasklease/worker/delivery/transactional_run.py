"""How the executor runs a ``transactional=True`` handler: inside the store's own transaction,
whose commit also writes the run's completion record, conditional on this attempt still
holding the claim (:class:`~tasklease.worker.stores.base.transactional.TransactionalStore`).

The handler's writes through ``ctx.transaction`` and the record commit together or not at
all, so a crash anywhere leaves either both (a retry answers from the record) or neither (a
retry runs the handler again, on a database without its effects).

A cancellation reaches a transactional handler through its lease renewals only (it has no
steps): once the attempt has seen it (``ctx.cancelled``), the transaction is rolled back
however the handler ends, and the run ends ``cancelled``. A mark that lands after the
attempt's last renewal does not stop its commit: the run completes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from tasklease.worker.core import decisions
from tasklease.worker.core.endings import UnserialisableResult, ending_of
from tasklease.worker.core.outcome import Outcome
from tasklease.worker.delivery.endings import Finisher
from tasklease.worker.delivery.flow import handler_run, run_in_thread
from tasklease.worker.delivery.lease import KeepsLeases
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.handlers.router import HandlerSpec
from tasklease.worker.observe import telemetry
from tasklease.worker.runtime.running import current_call, handler_call
from tasklease.worker.stores.base.transactional import TransactionalStore, TransactionOutcome

__all__ = ["run_in_transaction"]


def run_in_transaction(
    keeper: KeepsLeases,
    finisher: Finisher,
    spec: HandlerSpec,
    ctx: TaskContext,
    live: Attempt,
    *,
    payload: Any,
    body: bytes,
    log: dict[str, Any],
) -> Reply:
    """Run ``spec``'s handler for the claimed attempt ``live`` in the transaction of the
    store ``finisher`` writes to, its lease renewed by ``keeper``, and answer as the plain
    path does for any handler: every ending but the commit is written by ``finisher``.
    ``log`` gets ``transaction_tries``."""
    store = finisher.store
    if not isinstance(store, TransactionalStore):  # create_app refuses it at start.
        raise TypeError(f"{store!r} cannot run the transactional handler {spec.name}")
    clock: Callable[[], datetime] = finisher.clock
    tries = 0

    def work(transaction: Any) -> str | None:
        nonlocal tries
        tries += 1
        log["transaction_tries"] = tries
        # Checked again as the transaction opens, as a transactional step does: the attempt
        # may have stalled, or its call been held up, past its lease on the way here. Its
        # commit would be fenced, but the handler's effects outside the transaction not.
        live.check_lease()
        live.check_cancelled()  # A try again after the attempt saw the run cancelled.
        call = current_call()
        if call is not None:  # A try again: its enqueues name the tasks of the first.
            call.restart()
        live.transaction = transaction
        try:
            # The store calls this inside its transaction: the handler's awaits are driven
            # here, by the driver the plain path's delivery uses.
            result = run_in_thread(handler_run(spec, payload, ctx))
        finally:
            live.transaction = None
        # Seen cancelled meanwhile (a renewal): raised inside, so nothing it wrote commits.
        live.check_cancelled()
        try:
            return decisions.serialize_result(result)
        except ValueError as exc:  # Raised inside the transaction, so it rolls back.
            raise UnserialisableResult(str(exc)) from exc

    try:
        with (
            keeper.kept(live, spec.lease, keep_for=spec.retention),
            telemetry.step("handler"),
            handler_call(ctx.run_id, spec.name, ctx.continuation),
        ):
            outcome = store.complete_in_transaction(
                live.run_id, live.attempt_id, work, clock, keep_for=spec.retention
            )
    except BaseException as exc:  # SystemExit too: sys.exit(), argparse's error().
        if live.cancelled:  # Rolled back: the run ends cancelled, never retried.
            how = f"raised {type(exc).__name__}, rolled back"
            reply = finisher.cancel(live, f"cancelled while it ran (the handler {how})")
            if ending_of(exc, in_transaction=True).reraise:
                raise
            return reply
        return finisher.end(live, ending_of(exc, in_transaction=True), exc, body)
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
