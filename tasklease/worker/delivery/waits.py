"""Suspending a run on ``ctx.wait_for`` and resuming it: the delivery's side of durable waits.

A delivery whose handler waits (``WaitSuspended``) enqueues the wait's timeout task (once,
by name, at the deadline), then records the run ``waiting``, fenced, keeping its steps and
the task's payload. If a signal came while the handler ran, the record shows it: the resume
task is enqueued at once. A signal sent later enqueues it (``tasklease.signal``). Either
task carries :data:`~tasklease.protocol.RESUME_HEADER` and no payload: the resumed delivery
takes the payload from the record. The rules are in :mod:`tasklease.worker.core.waits`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from tasklease import protocol
from tasklease.worker.core import decisions
from tasklease.worker.core import waits as rules
from tasklease.worker.core.identity import Kind
from tasklease.worker.core.outcome import Outcome
from tasklease.worker.core.records import RunStatus
from tasklease.worker.core.waits import Wait
from tasklease.worker.delivery.flow import Blocking, Steps
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.observe.logs import note_error

if TYPE_CHECKING:
    from tasklease.producer.building import EnqueueOptions
    from tasklease.producer.producer import Producer
    from tasklease.worker.core.identity import DeliveryIdentity
    from tasklease.worker.core.records import RunRecord
    from tasklease.worker.delivery.endings import Finisher
    from tasklease.worker.handlers.attempt import Attempt
    from tasklease.worker.handlers.router import HandlerSpec, Router
    from tasklease.worker.handlers.steps import StepRunner
    from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["Suspensions", "enqueue_resume", "waiting_reply"]

# The longest Retry-After an early timeout task is answered with: it is retried with the
# queue's backoff anyway (Cloud Tasks ignores Retry-After), this is for people and tests.
_EARLY_RETRY_AFTER_MAX = 3600


def enqueue_resume(
    producer: Producer, run_id: str, handler: str, wait: Wait, *, timeout: bool
) -> None:
    """Create the task that resumes ``wait`` (at its deadline for its timeout, else now),
    under a name derived from the run and the wait: created once however often asked."""
    options: EnqueueOptions = {
        "queue": wait.queue,
        "route": wait.route,
        "headers": {
            protocol.RESUME_HEADER: rules.resume_header(run_id, wait, timeout=timeout),
            **({protocol.FAN_IN_HEADER: wait.member} if wait.member is not None else {}),
        },
    }
    if timeout and wait.deadline is not None:
        options["at"] = wait.deadline
    if wait.audience:
        options["audience"] = wait.audience
    producer.enqueue(handler, None, key=rules.resume_key(run_id, wait, timeout=timeout), **options)


def waiting_reply(record: RunRecord, now: datetime) -> Reply:
    """The answer to a delivery of a run that waits and may not resume yet: 200, nothing
    ran (the queue stops; the run's signal, or its timeout task, resumes it)."""
    wait = rules.waits_of(record).wait
    name = "a signal" if wait is None else repr(wait.name)
    until = "" if wait is None or wait.deadline is None else f" until {wait.deadline.isoformat()}"
    return Reply.of(
        Outcome.WAITING,
        f"the run waits for {name}{until}; nothing ran",
        record.run_id,
        {"status": record.status.value},
    )


def _early(wait: Wait, now: datetime) -> Reply:
    """The answer to the timeout task due at ``wait``'s deadline, come before it by more than
    the clock skew (the queue's clock ahead of this instance's): 409, tried again."""
    assert wait.deadline is not None
    seconds = max(1, min(_EARLY_RETRY_AFTER_MAX, math.ceil((wait.deadline - now).total_seconds())))
    return Reply.of(
        Outcome.IN_PROGRESS,
        f"the wait for {wait.name!r} times out at {wait.deadline.isoformat()}, not yet; retry then",
        None,
        retry_after=seconds,
    )


def _own_timeout(identity: DeliveryIdentity, wait: Wait) -> bool:
    """Whether ``identity`` is a timeout task of ``wait``."""
    resume = identity.resumes
    return (
        resume is not None and resume.timeout and (resume.name, resume.seq) == (wait.name, wait.seq)
    )


class Suspensions:
    """Ends deliveries whose handler waits: the timeout task, the record, the answer."""

    def __init__(
        self, store: LeaseStore, router: Router, clock: Callable[[], datetime], finisher: Finisher
    ) -> None:
        self.store = store
        self.router = router
        self.clock = clock
        self.finisher = finisher

    def not_yet(self, record: RunRecord, identity: DeliveryIdentity) -> Steps[Reply]:
        """The answer to a delivery of a waiting run that may not resume yet. A timeout task
        of its wait come early is one of two: the task due at the deadline the record keeps
        (the queue's clock ahead: 409, tried again), or one created for an earlier deadline
        (a suspension retried records its own): it asks for the task due at the recorded
        deadline, created once by name, and is answered 200. So a test queue that delivers
        every task at once settles, and a timeout is never lost to an early task."""
        now = self.clock()
        wait = rules.waits_of(record).wait
        resume = identity.resumes
        if (
            wait is None
            or wait.deadline is None
            or resume is None
            or not _own_timeout(identity, wait)
        ):
            return waiting_reply(record, now)
        if resume.for_deadline(wait):
            early = _early(wait, now)
            return Reply.of(
                early.outcome, early.message, record.run_id, retry_after=early.retry_after
            )
        try:
            yield Blocking(
                lambda: enqueue_resume(
                    self.router.producer(), record.run_id, record.handler, wait, timeout=True
                )
            )
        except Exception as exc:
            note_error(exc)
            return Reply.of(
                Outcome.UNAVAILABLE,
                "this timeout task came before the deadline the wait keeps, and the task due "
                f"then could not be enqueued: {type(exc).__name__}: {exc}",
                record.run_id,
            )
        return Reply.of(
            Outcome.WAITING,
            f"the wait for {wait.name!r} times out at {wait.deadline.isoformat()}: this timeout "
            "task came for an earlier deadline; the one due then is enqueued",
            record.run_id,
            {"status": record.status.value},
        )

    def wait_of(
        self, spec: HandlerSpec, runner: StepRunner, queue: str | None, live: Attempt
    ) -> Wait:
        """The wait ``runner``'s handler suspended on, with where its resume tasks go."""
        suspension = runner.suspension
        assert suspension is not None
        scheduled = spec.kind is Kind.SCHEDULER
        return Wait(
            name=suspension.name,
            seq=suspension.seq,
            since=suspension.since,
            deadline=suspension.deadline,
            queue=spec.queue if scheduled else queue,
            route=protocol.SCHEDULER_ROUTE_PREFIX if scheduled else protocol.TASK_ROUTE_PREFIX,
            audience=spec.audience,
            member=None if live.fan_in is None else live.fan_in.header(),
        )

    def suspend(
        self,
        spec: HandlerSpec,
        runner: StepRunner,
        live: Attempt,
        identity: DeliveryIdentity,
        body: bytes,
    ) -> Steps[Reply]:
        """Record the run waiting, its timeout task created first; answer 200 once the
        record is written (a failure to create the task, or to write, is retried). The
        wait's own timeout task that finds it not yet due is answered 409, as before a
        claim: the queue tries it again."""
        wait = self.wait_of(spec, runner, identity.queue, live)
        payload = body.decode("utf-8", errors="backslashreplace") if body else None
        too_large = self._too_large(wait, payload, runner)
        if too_large is not None:
            return self.finisher.fail(live, too_large, body)
        if wait.deadline is not None:
            try:
                yield Blocking(
                    lambda: enqueue_resume(
                        self.router.producer(), live.run_id, spec.name, wait, timeout=True
                    )
                )
            except Exception as exc:
                note_error(exc)
                error = f"could not enqueue the wait's timeout: {type(exc).__name__}: {exc}"
                return self.finisher.release(live, error, error)
        written: list[RunRecord] = []

        def record_wait() -> bool:
            record = self.store.suspend(
                live.run_id, live.attempt_id, wait, payload, self.clock, keep_for=spec.retention
            )
            if record is None:
                # Only while the lease holds: then no other attempt can have claimed the run
                # before this suspension landed (a retry of a write whose answer was lost).
                if live.lease_lost:
                    return False
                found = self.store.get(live.run_id)
                if not rules.suspension_landed(found, wait):
                    return False
                assert found is not None
                record = found
            written[:] = [record]
            return True

        reply = self.finisher.finish(
            live,
            record_wait,
            Reply.of(
                Outcome.WAITING,
                f"waiting for {wait.name!r}"
                + ("" if wait.deadline is None else f" until {wait.deadline.isoformat()}"),
                live.run_id,
                {"status": "waiting"},
            ),
        )
        if not written or written[0].status is not RunStatus.WAITING:
            return reply  # Not recorded (the answer says why), or resumed since.
        return (yield from self._suspended(written[0], wait, identity, reply))

    def _too_large(self, wait: Wait, payload: str | None, runner: StepRunner) -> str | None:
        """Why the waiting run's record cannot keep its payload, or None."""
        room = self.store.max_record_bytes
        if payload is None or room is None:
            return None
        size = len(payload.encode())
        steps_size = sum(len(step.result_json.encode()) for step in runner.recorded.values())
        if size + steps_size + decisions.RECORD_MARGIN <= room:
            return None
        return (
            f"wait_for({wait.name!r}): a waiting run keeps its payload in its record, and "
            f"{size} bytes do not fit beside its steps in the {room} bytes this store's "
            "record holds: pass a reference to the data instead"
        )

    def _suspended(
        self, record: RunRecord, wait: Wait, identity: DeliveryIdentity, reply: Reply
    ) -> Steps[Reply]:
        """After the waiting ``record`` was written: its resume enqueued if its signal came
        while the handler ran (its sender saw the run running and left the resume to this
        delivery); the answer to its own timeout task that suspended it again."""
        due = rules.signal_due(record)
        if due is None:
            if _own_timeout(identity, wait):
                return (yield from self.not_yet(record, identity))
            return reply
        try:
            yield Blocking(
                lambda: enqueue_resume(
                    self.router.producer(), record.run_id, record.handler, due, timeout=False
                )
            )
        except Exception as exc:
            note_error(exc)
            # The record waits with its signal: this delivery's retry resumes the run.
            return Reply.of(
                Outcome.UNAVAILABLE,
                f"the run waits with its signal come, and its resume could not be enqueued: "
                f"{type(exc).__name__}: {exc}",
                record.run_id,
            )
        return reply
