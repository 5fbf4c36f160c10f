"""The exactly-once-in-effect protocol for one delivery: authenticate, identify, claim, run,
finish. Framework-neutral: :mod:`tasklease.worker.serving.app` adapts it to Flask."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tasklease import protocol
from tasklease.errors import InvalidDelivery, StoreUnavailable
from tasklease.worker.auth.authenticators import Authenticator, AuthRequest
from tasklease.worker.core import cancellation, decisions
from tasklease.worker.core.endings import ending_of
from tasklease.worker.core.identity import DeliveryIdentity, HeaderLookup, Kind, parse_identity
from tasklease.worker.core.outcome import Outcome, Rejection
from tasklease.worker.core.records import ClaimRequest, RunRecord, Verdict
from tasklease.worker.delivery import continuation
from tasklease.worker.delivery.cancels import Cancels
from tasklease.worker.delivery.endings import Finisher, store_unavailable
from tasklease.worker.delivery.flow import Blocking, Steps, handler_run, run_in_thread
from tasklease.worker.delivery.lease import (
    RENEWALS_PER_LEASE,
    KeepsLeases,
    LeaseKeeper,
    local_deadline,
)
from tasklease.worker.delivery.locks import ExecutionLocks
from tasklease.worker.delivery.log_levels import execution_level, known_handlers
from tasklease.worker.delivery.manual_runs import ManualRuns
from tasklease.worker.delivery.reply import Reply, settled
from tasklease.worker.delivery.transactional_run import run_in_transaction
from tasklease.worker.delivery.waits import Suspensions
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.handlers.context import TaskContext, view_of
from tasklease.worker.handlers.router import HandlerSpec, Router
from tasklease.worker.handlers.steps import StepRunner
from tasklease.worker.observe import telemetry
from tasklease.worker.observe.logs import instance_id, log_execution, note_error
from tasklease.worker.observe.tally_flusher import DeliveryCounter
from tasklease.worker.runtime.clock import REAL_TIMING, Clock, Timing, utc_now
from tasklease.worker.runtime.running import handler_call
from tasklease.worker.stores.base.store import LeaseStore

# Reply lives in its own module; it is exported here too, where the adapters import it from.
__all__ = ["Delivery", "Executor", "Reply", "decode_payload"]


# Verdicts a read alone may act on: a finished run stays finished until its record expires.
_SETTLED = frozenset(
    {Verdict.COMPLETED, Verdict.FAILED, Verdict.FORBIDDEN, Verdict.SKIPPED, Verdict.CANCELLED}
)

# A fan-in child whose run ended so: counted in its join (a cancelled one as failed).
_FINISHED_CHILD = frozenset({Verdict.COMPLETED, Verdict.FAILED, Verdict.CANCELLED})

_AUTH_OUTCOMES = {401: Outcome.UNAUTHENTICATED, 403: Outcome.FORBIDDEN, 503: Outcome.UNAVAILABLE}


def new_attempt_id() -> str:
    """A fresh attempt id: 32 random hex digits."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Delivery:
    """One HTTP request addressed to a handler, as the framework adapter read it."""

    kind: Kind
    handler: str
    header: HeaderLookup
    query: Mapping[str, str]
    body: bytes | None  # None: larger than body_limit, not read.
    url: str
    authorization: str | None = None
    method: str = "POST"
    refusal: str | None = None  # Set when the request is malformed below HTTP (its framing).
    body_limit: int = protocol.MAX_TASK_BYTES
    mount: str = ""  # The prefix the server mounts the routes under (ASGI's root_path).


class Executor:
    """Runs each delivery's handler at most once per claim, and at least once per run."""

    def __init__(
        self,
        router: Router,
        store: LeaseStore,
        authenticator: Authenticator,
        *,
        clock: Clock = utc_now,
        project_header: str = protocol.PROJECT_HEADER,
        location_header: str = protocol.LOCATION_HEADER,
        timing: Timing = REAL_TIMING,
        attempt_ids: Callable[[], str] = new_attempt_id,
        lease_keeper: KeepsLeases | None = None,
    ) -> None:
        """``timing``, ``attempt_ids`` and ``lease_keeper`` are the process's own unless a
        simulation drives the executor on virtual time with seeded ids
        (:mod:`tasklease.testing.simulation`)."""
        self.router = router
        self.store = store
        self.authenticator = authenticator
        self.clock = clock
        self.project_header = project_header
        self.location_header = location_header
        self.timing = timing
        self.attempt_ids = attempt_ids
        self.lease_keeper: KeepsLeases = lease_keeper or LeaseKeeper(store, clock)
        self.manual_runs = ManualRuns(store, clock)
        self.locks = ExecutionLocks(store, clock)
        self.finisher = Finisher(store, clock, self.locks, router)
        self.suspensions = Suspensions(store, router, clock, self.finisher)
        self.cancels = Cancels(store, clock)
        self.tally: DeliveryCounter | None = None  # Set by create_app on a tally store.

    def execute(self, delivery: Delivery) -> Reply:
        """Handle one delivery and write its one structured log line."""
        return run_in_thread(self.steps(delivery))

    def steps(self, delivery: Delivery) -> Steps[Reply]:
        """:meth:`execute` as steps for a driver (:mod:`tasklease.worker.delivery.flow`)."""
        started = time.monotonic()
        # The handler name comes from the URL: cap what an unknown one can put in the log.
        handler = delivery.handler[:100]
        log: dict[str, Any] = {"handler": handler, "kind": delivery.kind.value}
        spec = self.router.handler(delivery.kind, delivery.handler)
        label = spec.name if spec is not None else telemetry.UNKNOWN_HANDLER
        with telemetry.start_delivery(delivery.header, delivery.kind.value, label) as traced:
            reply = yield from self._execute(delivery, log)
            if "held_by" in reply.details:  # An exclusive job or key held by another run.
                log["held_by"] = reply.details["held_by"]
            seconds = time.monotonic() - started
            log.update(
                outcome=reply.outcome.value,
                status=reply.status,
                run_id=reply.run_id,
                duration_ms=round(seconds * 1000, 3),
                instance=instance_id(),
            )
            traced.finished(reply.status, reply.outcome, log, seconds)
        if self.tally is not None and spec is not None:
            self.tally.count(delivery.kind.value, spec.name, reply.outcome.value)
        if spec is None and reply.status == 404:
            log["known_handlers"] = known_handlers(self.router, delivery.kind)
        level = execution_level(reply.status, reply.outcome)
        log_execution(f"{delivery.kind.value} {handler}: {reply.message}", log, level)
        return reply

    def _execute(self, delivery: Delivery, log: dict[str, Any]) -> Steps[Reply]:
        if delivery.method != "POST":
            return Reply.rejected(
                Rejection.NOT_POST,
                f"method {delivery.method} not allowed: use POST",
                {"allow": "POST"},
            )
        spec = self.router.handler(delivery.kind, delivery.handler)
        if spec is None:
            return Reply.rejected(
                Rejection.NO_HANDLER, f"no {delivery.kind.value} handler of that name"
            )
        if delivery.body is None:
            return Reply.rejected(Rejection.TOO_LARGE, f"body over {delivery.body_limit} bytes")
        if delivery.refusal is not None:
            return Reply.rejected(Rejection.MALFORMED, delivery.refusal)
        auth = self.authenticator.authenticate(
            AuthRequest(delivery.authorization, delivery.url, delivery.mount), spec
        )
        log.update(auth.log_fields())
        if not auth.allowed:
            return Reply.of(_AUTH_OUTCOMES[auth.status], auth.reason)
        telemetry.authenticated()  # Only now may the caller's traceparent name the trace.
        try:
            identity = parse_identity(
                delivery.kind,
                spec.name,
                delivery.header,
                delivery.query,
                project_header=self.project_header,
                location_header=self.location_header,
                received_at=self.clock(),
                manual_run_margin=spec.manual_run_margin,
            )
        except InvalidDelivery as exc:
            return Reply.rejected(Rejection.MALFORMED, str(exc))
        try:
            identity = self.manual_runs.resolve(identity, auth.principal)
        except StoreUnavailable as exc:
            return store_unavailable(f"lease store unavailable: {exc}", identity.run_id)
        reply = yield from self._claim_and_run(spec, identity, delivery.body, log, auth.principal)
        self.manual_runs.answered(identity, reply.status)
        return reply

    def _claim_and_run(
        self,
        spec: HandlerSpec,
        identity: DeliveryIdentity,
        body: bytes,
        log: dict[str, Any],
        caller: str | None,
    ) -> Steps[Reply]:
        log.update(_identity_fields(identity))
        run_id = identity.run_id
        if (refused := self.finisher.fan_ins.refusal(identity.fan_in)) is not None:
            return refused
        if identity.continues is not None or identity.is_retry:
            # A retry or a continuation has most likely been seen before: one read answers a
            # finished run without a write (no write lock on SQLite, one RPC on Firestore).
            try:
                seen = self.store.get(run_id)
            except StoreUnavailable as exc:
                return store_unavailable(f"lease store unavailable: {exc}", run_id)
            now = self.clock()
            if identity.continues is not None:
                refused = continuation.refusal(seen, identity, spec, caller, now)
                if refused is not None:
                    return refused
            verdict = decisions.decide(seen, now, caller)
            if seen is not None and verdict is Verdict.WAITING:
                return (yield from self.suspensions.not_yet(seen, identity))
            if seen is not None and verdict in _SETTLED:
                return self._settled(verdict, seen, log, identity, spec)
        try:
            cancelled_parent = self.cancels.cancelled_parent(identity)
        except StoreUnavailable as exc:
            return store_unavailable(f"lease store unavailable: {exc}", run_id)
        request = ClaimRequest(
            run_id=run_id,
            kind=identity.kind.value,
            handler=spec.name,
            attempt_id=self.attempt_ids(),
            lease=spec.lease,
            retention=spec.retention,
            identity=identity.fields(),
            caller=caller,
        )
        asked_at, asked = self.clock(), self.timing.monotonic()
        try:
            with telemetry.claim_step():
                claim = self.store.claim(request, self.clock)
        except StoreUnavailable as exc:
            return store_unavailable(f"lease store unavailable: {exc}", run_id)
        record = claim.record
        if claim.verdict is not Verdict.CLAIMED and identity.manual and identity.maybe_manual:
            # Another delivery took the waiting manual run first: this one is the slot's.
            return (yield from self._claim_and_run(spec, identity.as_slot(), body, log, caller))
        if claim.verdict is Verdict.IN_PROGRESS and (
            moved := continuation.behind(record, identity)
        ):
            return moved  # A later delivery of the chain holds the run: this one is done.
        if claim.verdict is Verdict.WAITING:
            return (yield from self.suspensions.not_yet(record, identity))
        if claim.verdict is not Verdict.CLAIMED:
            return self._settled(claim.verdict, record, log, identity, spec)
        log.update(
            attempt_id=record.attempt_id,
            attempt=record.attempts,
            fencing_token=record.fencing_token,
        )
        if claim.took_over_from:
            log["took_over_from"] = claim.took_over_from
        if identity.resumes is not None:
            # A resume task carries no payload: the waiting run kept its own.
            body = (record.payload or "").encode()
        live = Attempt(
            identity.kind.value,
            spec.name,
            record.run_id,
            record.attempt_id,
            record.lease_expires,
            fan_in=identity.fan_in,
            parent_run_id=identity.parent_run_id,
            number=record.attempts,
            timing=self.timing,
        )
        runner = StepRunner.of(record, live, self.store, self.clock)
        ctx = view_of(live, identity, record, body, runner, producers=self.router)
        answered = self.timing.monotonic()
        live.confirm_lease(
            record.lease_expires,
            local_deadline(record.lease_expires, asked_at, asked, spec.lease, answered),
        )
        if live.lease_seconds_left < spec.lease.total_seconds() / RENEWALS_PER_LEASE:
            # The lease would run out before its first renewal (a clock read long before the
            # store wrote it): running the handler now could overlap a takeover.
            self.finisher.give_back(
                live, "the claim took too long; lease store overloaded", count=False
            )
            return store_unavailable("the lease store took too long to grant the claim", run_id)
        waiting = continuation.gate(record, identity)
        if waiting is not None:  # Another delivery of the chain runs the run, or will.
            self.finisher.give_back(live, waiting.message, count=False)
            return waiting
        if cancelled_parent is not None:  # Its parent's cancellation ends it unrun.
            return self.finisher.cancel(
                live,
                f"its parent run {cancelled_parent} was cancelled; nothing ran",
                by=cancellation.parent_note(cancelled_parent),
            )
        reply = yield from self._run(spec, ctx, runner, live, body, identity=identity, log=log)
        log.update(runner.log_fields())
        return reply

    def _settled(
        self,
        verdict: Verdict,
        record: RunRecord,
        log: dict[str, Any],
        identity: DeliveryIdentity,
        spec: HandlerSpec,
    ) -> Reply:
        """The answer to a delivery that may not run the handler, given the stored record; a
        finished fan-in child's settles its join first (counted, closed), if still due. A run
        marked cancelled whose holder is gone is ended ``cancelled`` first."""
        if verdict is Verdict.CANCELLED and (unsettled := self.cancels.settle(record)):
            return unsettled
        reply = self._settled_reply(verdict, record, log)
        if identity.fan_in is not None and verdict in _FINISHED_CHILD:
            return self.finisher.fan_ins.recount(
                identity.fan_in,
                record.run_id,
                reply,
                spec.retention,
                # A cancellation by an operator writes no count: the child counts now.
                counted_with_record=not spec.transactional and verdict is not Verdict.CANCELLED,
            )
        return reply

    def _settled_reply(self, verdict: Verdict, record: RunRecord, log: dict[str, Any]) -> Reply:
        if verdict is not Verdict.FORBIDDEN:  # Another caller learns nothing of the run.
            log.update(
                attempt_id=record.attempt_id,
                attempt=record.attempts,
                fencing_token=record.fencing_token,
            )
        if verdict is Verdict.SKIPPED:
            details = record.result or {}
            log.update(held_by=details.get("held_by"), lock=details.get("lock"))
        return settled(verdict, record, self.clock)

    def _run(
        self,
        spec: HandlerSpec,
        ctx: TaskContext,
        runner: StepRunner,
        live: Attempt,
        body: bytes,
        *,
        identity: DeliveryIdentity,
        log: dict[str, Any],
    ) -> Steps[Reply]:
        finisher = self.finisher
        if spec.max_attempts is not None and ctx.attempt > spec.max_attempts:
            # Only reached through a claim: every earlier attempt's lease had run out.
            error = f"gave up after {spec.max_attempts} attempts (max_attempts)"
            return finisher.fail(live, error, body)
        payload: Any = None
        if spec.kind is Kind.TASK:
            try:
                payload = decode_payload(body)
            except ValueError as exc:
                return finisher.fail(live, f"payload is not valid JSON: {exc}", body)
        lock = self.locks.request_for(spec, ctx, payload)
        if isinstance(lock, str):
            return finisher.fail(live, lock, body)
        if lock is not None:
            try:
                # A resumed run is never skipped either: it released the lock while it waited.
                continued = ctx.continuation > 0 or identity.resumes is not None
                overlap = self.locks.take(spec, live, lock, continued=continued)
            except StoreUnavailable as exc:
                finisher.give_back(live, f"could not take the lock {lock.name}: {exc}", count=False)
                return store_unavailable(f"lease store unavailable: {exc}", live.run_id)
            if overlap is not None:
                return finisher.finish(live, overlap.write, overlap.reply)
        if spec.transactional:
            reply = run_in_transaction(
                self.lease_keeper,
                finisher,
                spec,
                ctx,
                live,
                payload=payload,
                body=body,
                log=log,
            )
            if live.fan_in is not None and reply.outcome is Outcome.PROCESSED:
                # Its record committed in the handler's transaction, not beside its join:
                # counted now, or by the retry a failure here answers for.
                return finisher.fan_ins.recount(
                    live.fan_in, live.run_id, reply, spec.retention, counted_with_record=False
                )
            return reply
        try:
            with (
                self.lease_keeper.kept(live, spec.lease, keep_for=spec.retention),
                telemetry.step("handler"),
                handler_call(ctx.run_id, spec.name, ctx.continuation),
            ):
                result = yield from handler_run(spec, payload, ctx)
        except BaseException as exc:  # SystemExit too: sys.exit(), argparse's error().
            if live.cancelled:  # However it ended once it saw the cancellation.
                return self._cancelled(live, exc)
            if runner.suspension is not None:  # ctx.wait_for: the run waits.
                return (yield from self.suspensions.suspend(spec, runner, live, identity, body))
            return finisher.end(live, ending_of(exc, in_transaction=False), exc, body)
        if live.cancelled:
            return self._cancelled(live, None)
        if runner.suspension is not None:  # The handler caught WaitSuspended: it waits still.
            return (yield from self.suspensions.suspend(spec, runner, live, identity, body))
        if runner.continuation is not None:
            return (yield from self._continue(spec, ctx, runner, live, payload))
        try:
            # Serialised once, here: the store keeps these bytes and every answer sends them.
            result_json = decisions.serialize_result(result)
        except ValueError as exc:
            # The handler's effects happened: a retry must not repeat them. A dead letter
            # with the reason, not a 500 on every delivery.
            return finisher.fail(live, str(exc), body)
        return finisher.complete(live, result_json)

    def _cancelled(self, live: Attempt, exc: BaseException | None) -> Reply:
        """End a run the attempt saw cancelled: ``cancelled``, never retried; a
        ``KeyboardInterrupt`` goes on once written."""
        how = "returned" if exc is None else f"raised {type(exc).__name__}"
        reply = self.finisher.cancel(live, f"cancelled while it ran (the handler {how})")
        if exc is not None and ending_of(exc, in_transaction=False).reraise:
            raise exc
        return reply

    def _continue(
        self, spec: HandlerSpec, ctx: TaskContext, runner: StepRunner, live: Attempt, payload: Any
    ) -> Steps[Reply]:
        """End the delivery with the continuation the handler asked for: enqueue it (once,
        by name), then record it, fenced. A refused record leaves the task to wait for the
        run (continuation.gate); a failed enqueue releases the run for a retry."""
        try:
            state_json = yield Blocking(
                lambda: continuation.enqueue_next(
                    self.router,
                    spec,
                    runner,
                    payload,
                    ctx.queue,
                    member=live.fan_in,
                    parent=live.parent_run_id,
                )
            )
        except Exception as exc:
            note_error(exc)
            error = f"could not enqueue the continuation: {type(exc).__name__}: {exc}"
            return self.finisher.release(live, error, error)
        seq = runner.continuation.seq if runner.continuation else 0

        def record_continuation() -> bool:
            if self.store.continue_run(
                live.run_id, live.attempt_id, state_json, self.clock, keep_for=spec.retention
            ):
                return True
            # Only while the lease holds: then no other attempt of this delivery can have
            # recorded the continuation in its place.
            return not live.lease_lost and continuation.recorded(self.store.get(live.run_id), seq)

        return self.finisher.finish(
            live,
            record_continuation,
            Reply.of(Outcome.PROCESSED, f"continued: delivery {seq} enqueued", live.run_id),
        )


def decode_payload(body: bytes) -> Any:
    """The JSON payload of a task; an empty body is ``None``. Raises ValueError if not JSON."""
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None


def _identity_fields(identity: DeliveryIdentity) -> dict[str, Any]:
    fields: dict[str, Any] = identity.fields()
    fields["trigger"] = identity.trigger
    if identity.kind is Kind.TASK:
        fields.update(retry_count=identity.retry_count, execution_count=identity.execution_count)
    return fields
