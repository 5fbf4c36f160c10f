"""The exactly-once-in-effect protocol for one delivery: authenticate, identify, claim, run,
finish. Framework-neutral: :mod:`tasklease.worker.app` adapts it to Flask."""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tasklease.worker import constants as c
from tasklease.worker import decisions, lease, locking, telemetry
from tasklease.worker.auth import Authenticator, AuthRequest
from tasklease.worker.context import TaskContext
from tasklease.worker.errors import InvalidDelivery, LeaseLost, PermanentFailure, StoreUnavailable
from tasklease.worker.identity import DeliveryIdentity, HeaderLookup, Kind, parse_identity
from tasklease.worker.lease import RENEWALS_PER_LEASE, LeaseKeeper, local_deadline
from tasklease.worker.logs import instance_id, log_execution, note_error
from tasklease.worker.manual_runs import ManualRuns
from tasklease.worker.outcome import Outcome
from tasklease.worker.records import ClaimRequest, LockGrant, LockRequest, RunRecord, Verdict
from tasklease.worker.router import HandlerSpec, Router
from tasklease.worker.stores.base import LeaseStore

Clock = Callable[[], datetime]
_log = logging.getLogger("tasklease.execution")

# A finish (complete/fail/release) the store refuses is retried after these pauses: the handler
# already ran, so recording how it ended is worth a short wait.
FINISH_RETRY_PAUSES = (0.05, 0.2, 0.5)

# Verdicts a read alone may act on: a finished run stays finished until its record expires.
_SETTLED = frozenset({Verdict.COMPLETED, Verdict.FAILED, Verdict.FORBIDDEN, Verdict.SKIPPED})

_AUTH_OUTCOMES = {401: Outcome.UNAUTHENTICATED, 403: Outcome.FORBIDDEN, 503: Outcome.UNAVAILABLE}


def utc_now() -> datetime:
    return datetime.now(UTC)


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
    body_limit: int = c.MAX_BODY_BYTES


@dataclass
class Reply:
    """The answer to one delivery."""

    status: int
    outcome: Outcome
    message: str
    run_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    retry_after: int | None = None
    # The run's result as stored: JSON text spliced into the body as it is, so the first
    # answer and every duplicate's carry the same bytes.
    result_json: str | None = None

    def body(self) -> dict[str, Any]:
        """The answer as a mapping (the result decoded), for programs and tests."""
        body = {
            "outcome": self.outcome.value,
            "message": self.message,
            "run_id": self.run_id,
            **self.details,
        }
        if self.result_json is not None:
            body["result"] = json.loads(self.result_json)
        return body

    def body_bytes(self) -> bytes:
        """The JSON answer: the envelope, then the stored result's own bytes."""
        envelope = json.dumps(
            {"outcome": self.outcome.value, "message": self.message, "run_id": self.run_id}
            | self.details,
            separators=(",", ":"),
            default=str,
        )
        if self.result_json is None:
            return envelope.encode()
        return f'{envelope[:-1]},"result":{self.result_json}}}'.encode()

    def headers(self) -> dict[str, str]:
        headers = {c.OUTCOME_HEADER: self.outcome.value}
        if self.run_id:
            headers[c.RUN_ID_HEADER] = self.run_id
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return headers


class Executor:
    """Runs each delivery's handler at most once per claim, and at least once per run."""

    def __init__(
        self,
        router: Router,
        store: LeaseStore,
        authenticator: Authenticator,
        *,
        clock: Clock = utc_now,
        project_header: str = c.PROJECT_HEADER,
        location_header: str = c.LOCATION_HEADER,
    ) -> None:
        self.router = router
        self.store = store
        self.authenticator = authenticator
        self.clock = clock
        self.project_header = project_header
        self.location_header = location_header
        self.lease_keeper = LeaseKeeper(store, clock)
        self.manual_runs = ManualRuns(store, clock)

    def execute(self, delivery: Delivery) -> Reply:
        """Handle one delivery and write its one structured log line."""
        started = time.monotonic()
        # The handler name comes from the URL: cap what an unknown one can put in the log.
        handler = delivery.handler[:100]
        log: dict[str, Any] = {"handler": handler, "kind": delivery.kind.value}
        spec = self.router.handler(delivery.kind, delivery.handler)
        label = spec.name if spec is not None else telemetry.UNKNOWN_HANDLER
        with telemetry.start_delivery(delivery.header, delivery.kind.value, label) as traced:
            reply = self._execute(delivery, log)
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
        level = logging.ERROR if reply.status >= 500 else logging.INFO
        if reply.outcome in (Outcome.UNAUTHENTICATED, Outcome.FORBIDDEN, Outcome.LOST_CLAIM):
            level = logging.WARNING
        log_execution(f"{delivery.kind.value} {handler}: {reply.message}", log, level)
        return reply

    def _execute(self, delivery: Delivery, log: dict[str, Any]) -> Reply:
        if delivery.method != "POST":
            return Reply(
                405,
                Outcome.REJECTED,
                f"method {delivery.method} not allowed: use POST",
                details={"allow": "POST"},
            )
        spec = self.router.handler(delivery.kind, delivery.handler)
        if spec is None:
            # 404 is retried: a retry may reach a newer deploy that has the handler.
            return Reply(404, Outcome.REJECTED, f"no {delivery.kind.value} handler of that name")
        if delivery.body is None:
            return Reply(413, Outcome.REJECTED, f"body over {delivery.body_limit} bytes")
        if delivery.refusal is not None:
            # 400 is retried by both services: the retry brings the whole request.
            return Reply(400, Outcome.REJECTED, delivery.refusal)
        auth = self.authenticator.authenticate(
            AuthRequest(delivery.authorization, delivery.url), spec
        )
        log.update(auth.log_fields())
        if not auth.allowed:
            retry_after = c.STORE_UNAVAILABLE_RETRY_AFTER if auth.status == 503 else None
            return Reply(
                auth.status, _AUTH_OUTCOMES[auth.status], auth.reason, retry_after=retry_after
            )
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
            return Reply(400, Outcome.REJECTED, str(exc))
        try:
            identity = self.manual_runs.resolve(identity, auth.principal)
        except StoreUnavailable as exc:
            return _store_unavailable(f"lease store unavailable: {exc}", identity.run_id)
        reply = self._claim_and_run(spec, identity, delivery.body, log, auth.principal)
        self.manual_runs.answered(identity, reply.status)
        return reply

    def _claim_and_run(
        self,
        spec: HandlerSpec,
        identity: DeliveryIdentity,
        body: bytes,
        log: dict[str, Any],
        caller: str | None,
    ) -> Reply:
        log.update(_identity_fields(identity))
        run_id = identity.run_id
        if identity.is_retry:
            # A retry has most likely been seen before: one read answers a finished run
            # without a write (no write lock on SQLite, one RPC on Firestore).
            try:
                seen = self.store.get(run_id)
            except StoreUnavailable as exc:
                return _store_unavailable(f"lease store unavailable: {exc}", run_id)
            verdict = decisions.decide(seen, self.clock(), caller)
            if seen is not None and verdict in _SETTLED:
                return self._settled(verdict, seen, log)
        request = ClaimRequest(
            run_id=run_id,
            kind=identity.kind.value,
            handler=spec.name,
            attempt_id=uuid.uuid4().hex,
            lease=spec.lease,
            retention=spec.retention,
            identity=identity.fields(),
            caller=caller,
        )
        asked_at, asked = self.clock(), time.monotonic()
        try:
            with telemetry.claim_step():
                claim = self.store.claim(request, self.clock)
        except StoreUnavailable as exc:
            return _store_unavailable(f"lease store unavailable: {exc}", run_id)
        record = claim.record
        if claim.verdict is not Verdict.CLAIMED and identity.manual and identity.maybe_manual:
            # Another delivery took the waiting manual run first: this one is the slot's.
            return self._claim_and_run(spec, identity.as_slot(), body, log, caller)
        if claim.verdict is not Verdict.CLAIMED:
            return self._settled(claim.verdict, record, log)
        log.update(
            attempt_id=record.attempt_id,
            attempt=record.attempts,
            fencing_token=record.fencing_token,
        )
        if claim.took_over_from:
            log["took_over_from"] = claim.took_over_from
        ctx = _context(spec, identity, record, body)
        ctx.confirm_lease(
            record.lease_expires, local_deadline(record.lease_expires, asked_at, asked, spec.lease)
        )
        if ctx.lease_seconds_left < spec.lease.total_seconds() / RENEWALS_PER_LEASE:
            # The lease would run out before its first renewal (a clock read long before the
            # store wrote it): running the handler now could overlap a takeover.
            self._give_back(ctx, "the claim took too long; lease store overloaded", count=False)
            return _store_unavailable("the lease store took too long to grant the claim", run_id)
        return self._run(spec, ctx, body)

    def _settled(self, verdict: Verdict, record: RunRecord, log: dict[str, Any]) -> Reply:
        """The answer to a delivery that may not run the handler, given the stored record."""
        run_id = record.run_id
        if verdict is Verdict.FORBIDDEN:
            # Say nothing of the run: not its status, result, attempts or owner.
            return Reply(403, Outcome.FORBIDDEN, "this run belongs to another caller", run_id)
        log.update(
            attempt_id=record.attempt_id,
            attempt=record.attempts,
            fencing_token=record.fencing_token,
        )
        if verdict is Verdict.COMPLETED:
            return Reply(
                200,
                Outcome.DUPLICATE,
                "already completed",
                run_id,
                {"status": record.status.value},
                result_json=record.result_json,
            )
        if verdict is Verdict.FAILED:
            return Reply(
                200,
                Outcome.DUPLICATE,
                "already failed permanently",
                run_id,
                {"status": record.status.value, "error": record.error},
            )
        if verdict is Verdict.SKIPPED:
            details = record.result or {}
            log.update(held_by=details.get("held_by"), lock=details.get("lock"))
            return Reply(
                200,
                Outcome.SKIPPED_OVERLAP,
                f"skipped before: run {details.get('held_by')} held the job",
                run_id,
                {"status": record.status.value, "held_by": details.get("held_by")},
            )
        remaining = (record.lease_expires + c.MAX_CLOCK_SKEW - self.clock()).total_seconds()
        return Reply(
            409,
            Outcome.IN_PROGRESS,
            "another attempt holds the lease",
            run_id,
            retry_after=max(1, int(remaining + 0.999)),
        )

    def _run(self, spec: HandlerSpec, ctx: TaskContext, body: bytes) -> Reply:
        if spec.max_attempts is not None and ctx.attempt > spec.max_attempts:
            # Only reached through a claim: every earlier attempt's lease had run out.
            error = f"gave up after {spec.max_attempts} attempts (max_attempts)"
            return self._fail(ctx, error, body)
        payload: Any = None
        if spec.kind is Kind.TASK:
            try:
                payload = decode_payload(body)
            except ValueError as exc:
                return self._fail(ctx, f"payload is not valid JSON: {exc}", body)
        lock = self._lock_request(spec, ctx, payload)
        if isinstance(lock, str):
            return self._fail(ctx, lock, body)
        if lock is not None:
            refused = self._take_lock(spec, ctx, lock)
            if refused is not None:
                return refused
        try:
            with (
                self.lease_keeper.kept(ctx, spec.lease, keep_for=spec.retention),
                telemetry.step("handler"),
            ):
                if spec.kind is Kind.TASK:
                    result = spec.function(payload, ctx)
                else:
                    result = spec.function(ctx)
        except lease.KeeperNotStarted as exc:  # Raised before the handler ran: not an attempt.
            self._give_back(ctx, str(exc), count=False)
            return _store_unavailable(str(exc), ctx.run_id)
        except PermanentFailure as exc:
            return self._fail(ctx, f"PermanentFailure: {exc}", body)
        except LeaseLost as exc:
            self._give_back(ctx, f"LeaseLost: {exc}")
            return Reply(409, Outcome.LOST_CLAIM, str(exc), ctx.run_id)
        except Exception as exc:
            note_error(exc)  # Its stack trace goes into the request's one log line.
            error = f"{type(exc).__name__}: {exc}"
            return self._finish(
                ctx,
                lambda: self.store.release(
                    ctx.run_id, ctx.attempt_id, error, self.clock, keep_for=spec.retention
                ),
                Reply(
                    500,
                    Outcome.RELEASED,
                    f"handler raised {type(exc).__name__}; released for a retry",
                    ctx.run_id,
                ),
            )
        try:
            # Serialised once, here: the store keeps these bytes and every answer sends them.
            result_json = decisions.serialize_result(result)
        except ValueError as exc:
            # The handler's effects happened: a retry must not repeat them. A dead letter
            # with the reason, not a 500 on every delivery.
            return self._fail(ctx, str(exc), body)
        return self._finish(
            ctx,
            lambda: self.store.complete(
                ctx.run_id, ctx.attempt_id, result_json, self.clock, keep_for=spec.retention
            ),
            Reply(200, Outcome.PROCESSED, "processed", ctx.run_id, result_json=result_json),
        )

    def _lock_request(
        self, spec: HandlerSpec, ctx: TaskContext, payload: Any
    ) -> LockRequest | str | None:
        """The lock this execution must hold first (None: none); a str says why the payload
        has no concurrency key (a permanent failure: no retry will give it one)."""
        if spec.exclusive:
            name = locking.job_lock_name(spec.name, ctx.project, ctx.location)
        elif spec.concurrency_key is not None:
            try:
                key = spec.concurrency_key(payload)
            except Exception as exc:
                return f"concurrency_key raised {type(exc).__name__}: {exc}"
            if key is None or not isinstance(key, (str, int)) or isinstance(key, bool):
                return f"concurrency_key gave {key!r}: a str or int is needed"
            if len(str(key)) > c.MAX_CONCURRENCY_KEY_LENGTH:
                return f"concurrency_key is over {c.MAX_CONCURRENCY_KEY_LENGTH} characters"
            name = locking.key_lock_name(spec.name, ctx.project, ctx.location, str(key))
        else:
            return None
        return LockRequest(
            name=name,
            run_id=ctx.run_id,
            attempt_id=ctx.attempt_id,
            lease=spec.lease,
            max_runtime=spec.max_runtime,
            min_gap=spec.min_gap,
        )

    def _take_lock(self, spec: HandlerSpec, ctx: TaskContext, request: LockRequest) -> Reply | None:
        """Acquire ``request``'s lock for the claimed ``ctx``; None when held, else the reply.

        Taken after the run's claim, so a crash between the two leaves a claim whose lease
        lapses, never a lock without a claim; a lock whose holder crashed lapses by its own
        lease and safety expiry.
        """
        asked_at, asked = self.clock(), time.monotonic()
        # Set first: if the store fails, giving the claim back also releases a lock whose
        # write may have landed unseen (fenced by attempt id, so harmless if it did not).
        ctx.lock = request.name
        try:
            grant = self.store.acquire_lock(request, self.clock)
        except StoreUnavailable as exc:
            self._give_back(ctx, f"could not take the lock {request.name}: {exc}", count=False)
            return _store_unavailable(f"lease store unavailable: {exc}", ctx.run_id)
        if not grant.acquired:
            ctx.lock = None
            return self._overlap(spec, ctx, request.name, grant)
        ctx.lock_fencing_token = grant.lock.fencing_token
        deadline = local_deadline(grant.lock.lease_expires, asked_at, asked, spec.lease)
        ctx.confirm_lease(ctx.lease_expires, min(ctx.lease_deadline, deadline))
        return None

    def _overlap(self, spec: HandlerSpec, ctx: TaskContext, name: str, grant: LockGrant) -> Reply:
        """The answer to an execution whose lock another run holds: skipped (recorded), or
        given back unused for the queue to retry."""
        holder = grant.lock.holder_run_id
        if spec.kind is Kind.SCHEDULER and spec.on_overlap == "skip":
            return self._finish(
                ctx,
                lambda: self.store.skip(ctx.run_id, ctx.attempt_id, holder, name, self.clock),
                Reply(
                    200,
                    Outcome.SKIPPED_OVERLAP,
                    f"skipped: run {holder} holds the job",
                    ctx.run_id,
                    {"status": "skipped", "held_by": holder},
                ),
            )
        assert grant.free_at is not None
        wait = (grant.free_at - self.clock()).total_seconds()
        if not grant.lock.released:  # A live holder may end at any moment.
            wait = min(wait, c.LOCK_BUSY_RETRY_AFTER_MAX)
        outcome = Outcome.KEY_BUSY if spec.kind is Kind.TASK else Outcome.IN_PROGRESS
        what = "its concurrency key" if spec.kind is Kind.TASK else "the job"
        return self._finish(
            ctx,
            lambda: self.store.yield_claim(
                ctx.run_id, ctx.attempt_id, f"{outcome.value}: {name} held by {holder}", self.clock
            ),
            Reply(
                409,
                outcome,
                f"run {holder} holds {what}; retry later",
                ctx.run_id,
                {"held_by": holder},
                retry_after=max(1, math.ceil(wait)),
            ),
        )

    def _release_lock(self, ctx: TaskContext) -> bool:
        """Release the lock ``ctx`` holds, fenced by its attempt id. False: another run took
        it (this attempt's lease lapsed meanwhile). Retried on store errors like a finish;
        if the store stays down, the lock lapses by itself."""
        name = ctx.lock
        if name is None:
            return True
        for pause in (*FINISH_RETRY_PAUSES, None):
            try:
                held = self.store.release_lock(name, ctx.attempt_id, self.clock)
            except StoreUnavailable:
                if pause is None:
                    _log.warning("run %s: could not release lock %s", ctx.run_id, name)
                    return True
                time.sleep(pause)
            else:
                ctx.lock = None
                return held
        return True  # Unreachable: the loop returns.

    def _retention(self, ctx: TaskContext) -> timedelta | None:
        """The retention of the handler ``ctx`` runs, to keep its record that long after a
        finish (a run can outlive the retention counted from its claim)."""
        spec = self.router.handler(Kind(ctx.kind), ctx.handler)
        return spec.retention if spec is not None else None

    def _give_back(self, ctx: TaskContext, error: str, *, count: bool = True) -> None:
        """Release a claim this attempt will not use, if it still holds it (best effort: a
        lease that runs out does the same, later). ``count=False``: the handler never ran,
        the attempt does not count. Its lock, if any, is released first."""
        try:
            self._release_lock(ctx)
            if not count:
                self.store.yield_claim(ctx.run_id, ctx.attempt_id, error, self.clock)
                return
            self.store.release(
                ctx.run_id, ctx.attempt_id, error, self.clock, keep_for=self._retention(ctx)
            )
        except StoreUnavailable:
            _log.warning("run %s: could not release attempt %s", ctx.run_id, ctx.attempt_id)

    def _fail(self, ctx: TaskContext, error: str, body: bytes) -> Reply:
        payload = body.decode("utf-8", errors="backslashreplace")
        return self._finish(
            ctx,
            lambda: self.store.fail(
                ctx.run_id,
                ctx.attempt_id,
                error,
                self.clock,
                payload,
                keep_for=self._retention(ctx),
            ),
            Reply(200, Outcome.FAILED, error, ctx.run_id, {"status": "failed"}),
        )

    def _finish(self, ctx: TaskContext, write: Callable[[], bool], reply: Reply) -> Reply:
        """Record how the execution ended, only while this attempt still holds the claim.

        A retried write that finds its own earlier try landed counts as done (the store
        recognises it by attempt id). The lock the attempt holds is released first, fenced:
        if another run took it, this attempt's lease lapsed while it ran, and its outcome is
        refused like that of a run taken over.
        """
        lock = ctx.lock
        if not self._release_lock(ctx):
            self._give_back(ctx, f"the lock {lock} was taken over by another run while it ran")
            return Reply(
                409,
                Outcome.LOST_CLAIM,
                f"the lock {lock} was taken over by another run; "
                f"this attempt's {reply.outcome.value} outcome was not recorded",
                ctx.run_id,
            )
        for pause in (*FINISH_RETRY_PAUSES, None):
            try:
                with telemetry.step("finish"):
                    held = write()
                break
            except StoreUnavailable as exc:
                if pause is None:
                    # The record stays in progress until its lease expires; then a retry runs.
                    return _store_unavailable(
                        f"could not record the outcome ({reply.outcome.value}): {exc}",
                        ctx.run_id,
                        Outcome.UNRECORDED,
                    )
                time.sleep(pause)
        if not held:
            # Another attempt took over after this one's lease expired: it owns the record now,
            # and a retry will see its outcome. Never overwrite it.
            return Reply(
                409,
                Outcome.LOST_CLAIM,
                "the lease was taken over by another attempt; "
                f"this attempt's {reply.outcome.value} outcome was not recorded",
                ctx.run_id,
            )
        return reply


def _store_unavailable(
    message: str, run_id: str | None, outcome: Outcome = Outcome.UNAVAILABLE
) -> Reply:
    return Reply(503, outcome, message, run_id, retry_after=c.STORE_UNAVAILABLE_RETRY_AFTER)


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


def _context(
    spec: HandlerSpec, identity: DeliveryIdentity, record: RunRecord, body: bytes
) -> TaskContext:
    return TaskContext(
        kind=identity.kind.value,
        handler=spec.name,
        run_id=record.run_id,
        attempt_id=record.attempt_id,
        fencing_token=record.fencing_token,
        attempt=record.attempts,
        lease_expires=record.lease_expires,
        body=body,
        queue=identity.queue,
        task_name=identity.task_name,
        retry_count=identity.retry_count,
        execution_count=identity.execution_count,
        eta=identity.eta,
        previous_response=identity.previous_response,
        retry_reason=identity.retry_reason,
        job_name=identity.job_name,
        schedule_time=identity.schedule_time,
        project=identity.project,
        location=identity.location,
    )


def _identity_fields(identity: DeliveryIdentity) -> dict[str, Any]:
    fields: dict[str, Any] = identity.fields()
    fields["trigger"] = identity.trigger
    if identity.kind is Kind.TASK:
        fields.update(retry_count=identity.retry_count, execution_count=identity.execution_count)
    return fields
