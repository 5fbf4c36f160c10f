"""Continuations (``ctx.continue_later``): which delivery of a run may run it, and how a
delivery hands the run on to the next one.

Delivery ``n`` of a run (0: its own task or Scheduler delivery; n: the continuation task
(on the handler's own route, ``/jobs/<name>`` for a scheduled run) the n-th
``continue_later`` enqueued, carrying :data:`~tasklease.protocol.CONTINUATION_HEADER`) runs
the handler only while the record's continuation number is ``n``. An earlier delivery (a
duplicate, or a retry whose response was lost) is answered 200 without running; a later one
(enqueued by an attempt whose record write was then refused) waits, answered 409, until the
run catches up with it. Once the run has finished, every delivery of it, continuations
included, gets the duplicate answer (200).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tasklease import protocol
from tasklease.worker.core import decisions
from tasklease.worker.core import steps as rules
from tasklease.worker.core.identity import Kind
from tasklease.worker.core.outcome import Outcome, Rejection
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.delivery.reply import Reply

# Verdicts of a run that needs no more deliveries: its continuations get the settled answer.
FINISHED = frozenset({Verdict.COMPLETED, Verdict.FAILED, Verdict.SKIPPED, Verdict.CANCELLED})

if TYPE_CHECKING:
    from tasklease.joins import Member
    from tasklease.producer.building import EnqueueOptions
    from tasklease.worker.core.identity import DeliveryIdentity
    from tasklease.worker.core.records import RunRecord
    from tasklease.worker.handlers.router import HandlerSpec, Router
    from tasklease.worker.handlers.steps import StepRunner


def refusal(
    seen: RunRecord | None,
    identity: DeliveryIdentity,
    spec: HandlerSpec,
    caller: str | None,
    now: datetime,
) -> Reply | None:
    """Why a continuation delivery may not claim the run it names (read before the claim),
    or None. A continuation header names a live run of the same handler. A finished run
    (or another caller's) is left to the settled answer the executor gives a retry, before
    any sequence number is compared: a stray continuation of a finished run is a duplicate
    (200), never a 409 or a 400 that Cloud Tasks would retry until its retries ran out.
    Another caller's run is answered as such, revealing nothing of it."""
    verdict = decisions.decide(seen, now, caller)
    if verdict is Verdict.FORBIDDEN:
        return None
    if seen is None or not decisions.is_live(seen, now):
        return Reply.rejected(Rejection.MALFORMED, "the continuation names no run of this handler")
    if seen.handler != spec.name or seen.kind != identity.kind.value:
        return Reply.rejected(Rejection.MALFORMED, "the continuation names no run of this handler")
    if verdict in FINISHED:
        return None
    if identity.resumes is not None:  # A resume of delivery 0 names a run never continued.
        return None if verdict is Verdict.WAITING else gate(seen, identity)
    if rules.continuation_of(seen).seq == 0 and not _may_be_in_flight(seen, identity):
        return Reply.rejected(Rejection.MALFORMED, "the continuation names a run never continued")
    return gate(seen, identity)


def _may_be_in_flight(seen: RunRecord, identity: DeliveryIdentity) -> bool:
    """Whether continuation 1 of a run whose record names none yet may be real: the first
    delivery enqueues it before recording it, so while that delivery holds the run (or
    died holding it, its retry to record it) the task can arrive first. It waits (409)."""
    return seen.status is RunStatus.IN_PROGRESS and identity.continuation_seq == 1


def behind(record: RunRecord, identity: DeliveryIdentity) -> Reply | None:
    """The duplicate answer for a delivery the run's chain has moved past, or None. Given
    also while a later delivery holds the run: a 409 would have the queue retry a delivery
    that never runs (and Cloud Scheduler count a failed attempt of the job)."""
    current = rules.continuation_of(record).seq
    if identity.continuation_seq < current:
        return Reply.of(
            Outcome.DUPLICATE,
            f"this delivery was continued by delivery {current} of the run; nothing ran",
            record.run_id,
        )
    return None


def gate(record: RunRecord, identity: DeliveryIdentity) -> Reply | None:
    """None when ``identity``'s delivery is the one that runs the run now; else its answer."""
    current = rules.continuation_of(record).seq
    if identity.continuation_seq == current:
        return None
    if (earlier := behind(record, identity)) is not None:
        return earlier
    return Reply.of(
        Outcome.IN_PROGRESS,
        f"continuation {identity.continuation_seq} is ahead of the run (at {current}); retry later",
        record.run_id,
        retry_after=1,
    )


def recorded(record: RunRecord | None, seq: int) -> bool:
    """Whether ``record`` shows continuation ``seq`` (or a later one) recorded: the chain's
    next delivery claims the run only after it is (:func:`gate`), so a refused retry of the
    record's write that finds it there, taken by that delivery, had landed unheard."""
    return seq > 0 and record is not None and rules.continuation_of(record).seq >= seq


def enqueue_next(
    router: Router,
    spec: HandlerSpec,
    runner: StepRunner,
    payload: Any,
    queue: str | None,
    *,
    member: Member | None = None,
    parent: str | None = None,
) -> str:
    """Enqueue the continuation ``continue_later`` asked for (once: a name derived from the
    run and its number); return its continuation json to record.

    A task run's continuation goes to ``queue`` (the task's own), with its payload; a
    scheduled run's is a task on the job's route, in the handler's declared queue (else the
    producer's default), with no payload. Its token is for the handler's own ``audience`` when
    it sets one. A fan-in child's continuation carries its ``member`` header: the delivery that
    completes the chain counts the child in its join; a plain fan-out child's carries its
    ``parent`` run id, so the parent's cancellation stops the chain too."""
    continuation = runner.continuation
    assert continuation is not None
    scheduled = spec.kind is Kind.SCHEDULER
    options: EnqueueOptions = {
        "delay": timedelta(seconds=continuation.delay_seconds) or None,
        "queue": spec.queue if scheduled else queue,
        "route": protocol.SCHEDULER_ROUTE_PREFIX if scheduled else protocol.TASK_ROUTE_PREFIX,
        "headers": {
            protocol.CONTINUATION_HEADER: rules.continuation_header(
                runner.run_id, continuation.seq
            ),
            **({protocol.FAN_IN_HEADER: member.header()} if member is not None else {}),
            **({protocol.PARENT_HEADER: parent} if parent is not None else {}),
        },
    }
    if spec.audience:  # A handler with an audience of its own accepts tokens for it only.
        options["audience"] = spec.audience
    router.producer().enqueue(
        spec.name,
        None if scheduled else payload,
        key=rules.continuation_key(runner.run_id, continuation.seq),
        **options,
    )
    return rules.encode_continuation(continuation)
