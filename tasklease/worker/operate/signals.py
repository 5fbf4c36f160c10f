"""Sending a signal to a waiting run: ``tasklease.signal``, and what the CLI, the dashboard
and the worker's signal route call.

The signal is recorded in the run's record first, in one atomic change, then the resume task
is created under a name derived from the run and the wait. A sender that retries after a lost
answer records nothing new and asks for the same task, which Cloud Tasks creates once: the run
resumes once. A failure to create it raises, and the record keeps the signal: the retry, or
the wait's timeout task, resumes the run with it.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tasklease.worker.core import waits as rules
from tasklease.worker.core.waits import SignalDecision, SignalError, Signalled
from tasklease.worker.delivery.waits import enqueue_resume
from tasklease.worker.stores.base.retries import retry_while_unavailable

if TYPE_CHECKING:
    from collections.abc import Callable

    from tasklease.producer.producer import Producer
    from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["SignalDecision", "SignalError", "Signalled", "send_signal", "signal"]


def send_signal(
    run_id: str,
    name: str,
    payload: Any = None,
    *,
    store: LeaseStore,
    producer: Producer,
    clock: Callable[[], datetime] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> SignalDecision:
    """:func:`signal`, answering with what the signal found (for the CLI and the routes);
    ``clock`` and ``sleep`` (the pauses between retries of a store that could not be reached)
    for a caller on a clock of its own."""
    rules.check_name(name)
    payload_json = rules.encode_payload(payload)
    now = clock or (lambda: datetime.now(UTC))
    decision = retry_while_unavailable(
        lambda: store.signal_run(run_id, name, payload_json, now), sleep
    )
    if decision.resume is not None and decision.record is not None:
        enqueue_resume(producer, run_id, decision.record.handler, decision.resume, timeout=False)
    return decision


def signal(
    run_id: str, name: str, payload: Any = None, *, store: LeaseStore, producer: Producer
) -> bool:
    """Send the signal ``name`` with ``payload`` (JSON) to run ``run_id``, resuming its
    ``ctx.wait_for(name)`` exactly once; True when the run gets it (now, or at the wait it
    has not reached yet; also for a signal sent again: it resumes the run once, with the
    first payload). False when the run has ended (completed, failed, cancelled), the wait of
    that name timed out, or no such run is kept.

    ``store`` is the worker's store, ``producer`` one that reaches the worker (the resume is a
    Cloud Tasks task). Raises ``SignalError`` for a name or payload that cannot be sent,
    ``StoreUnavailable`` when the store cannot be reached (nothing was recorded), and the
    producer's ``EnqueueError`` when the resume task could not be created (the signal is
    recorded: send it again to retry)."""
    return send_signal(run_id, name, payload, store=store, producer=producer).outcome.accepted
