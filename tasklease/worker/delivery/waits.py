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


def waiting_reply(record: RunRecord, identity: DeliveryIdentity, now: datetime) -> Reply:
    """The answer to a delivery of a run that waits and may not resume yet. The wait's own
    timeout task, come before its deadline (a clock ahead, or a test queue delivering every
    task at once), is answered 409 so the queue tries it again; any other delivery 200."""
    wait = rules.waits_of(record).wait
    name = "a signal" if wait is None else repr(wait.name)
    resume = identity.resumes
    if (
        resume is not None
        and resume.timeout
        and wait is not None
        and (resume.name, resume.seq) == (wait.name, wait.seq)
        and wait.deadline is not None
    ):
        seconds = max(
            1, min(_EARLY_RETRY_AFTER_MAX, math.ceil((wait.deadline - now).total_seconds()))
        )
        return Reply.of(
            Outcome.IN_PROGRESS,
            f"the wait for {name} times out at {wait.deadline.isoformat()}, not yet; retry then",
            record.run_id,
            retry_after=seconds,
        )
    until = "" if wait is None or wait.deadline is None else f" until {wait.deadline.isoformat()}"
    return Reply.of(
        Outcome.WAITING,
        f"the run waits for {name}{until}; nothing ran",
        record.run_id,
        {"status": record.status.value},
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
        queue: str | None,
        body: bytes,
    ) -> Steps[Reply]:
        """Record the run waiting, its timeout task created first; answer 200 once the
        record is written (a failure to create the task, or to write, is retried)."""
        wait = self.wait_of(spec, runner, queue, live)
        payload = body.decode("utf-8", errors="backslashreplace") if body else None
        room = self.store.max_record_bytes
        if payload is not None and room is not None:
            size = len(payload.encode())
            steps_size = sum(len(step.result_json) for step in runner.recorded.values())
            if size + steps_size + decisions.RECORD_MARGIN > room:
                return self.finisher.fail(
                    live,
                    f"wait_for({wait.name!r}): a waiting run keeps its payload in its record, "
                    f"and {size} bytes do not fit beside its steps in the {room} bytes this "
                    "store's record holds: pass a reference to the data instead",
                    body,
                )
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
            if record is not None:
                written[:] = [record]
                return True
            # A retry whose first try landed unheard, the run since claimed by the delivery
            # that resumes it. Only while the lease holds: then no other attempt can have
            # recorded this wait in its place. That delivery resumes the run: nothing is due.
            return not live.lease_lost and rules.shows_suspension(self.store.get(live.run_id), wait)

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
        if not written or (due := rules.signal_due(written[0])) is None:
            return reply
        # The signal came while the handler ran: its sender saw the run running and left
        # the resume to this delivery.
        try:
            yield Blocking(
                lambda: enqueue_resume(
                    self.router.producer(), live.run_id, spec.name, due, timeout=False
                )
            )
        except Exception as exc:
            note_error(exc)
            # The record waits with its signal: this delivery's retry resumes the run.
            return Reply.of(
                Outcome.UNAVAILABLE,
                f"the run waits with its signal come, and its resume could not be enqueued: "
                f"{type(exc).__name__}: {exc}",
                live.run_id,
            )
        return reply
