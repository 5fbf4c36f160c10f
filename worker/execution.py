"""The exactly-once-in-effect protocol for one delivery: authenticate, identify, claim, run,
finish. Framework-neutral: :mod:`worker.app` adapts it to Flask."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from worker import constants as c
from worker import decisions
from worker.auth import Authenticator, AuthRequest
from worker.context import TaskContext
from worker.errors import InvalidDelivery, LeaseLost, PermanentFailure, StoreUnavailable
from worker.identity import DeliveryIdentity, HeaderLookup, Kind, parse_identity
from worker.lease import LeaseKeeper
from worker.logs import instance_id, log_execution
from worker.outcome import Outcome
from worker.records import ClaimRequest, RunRecord, Verdict
from worker.router import HandlerSpec, Router
from worker.stores.base import LeaseStore

Clock = Callable[[], datetime]

# A finish (complete/fail/release) the store refuses is retried after these pauses: the handler
# already ran, so recording how it ended is worth a short wait.
FINISH_RETRY_PAUSES = (0.05, 0.2, 0.5)

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
    body: bytes | None  # None: larger than MAX_BODY_BYTES, not read.
    url: str
    authorization: str | None = None
    method: str = "POST"


@dataclass
class Reply:
    """The answer to one delivery."""

    status: int
    outcome: Outcome
    message: str
    run_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    retry_after: int | None = None

    def body(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "message": self.message,
            "run_id": self.run_id,
            **self.details,
        }

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

    def execute(self, delivery: Delivery) -> Reply:
        """Handle one delivery and write its one structured log line."""
        started = time.monotonic()
        # The handler name comes from the URL: cap what an unknown one can put in the log.
        handler = delivery.handler[:100]
        log: dict[str, Any] = {"handler": handler, "kind": delivery.kind.value}
        reply = self._execute(delivery, log)
        log.update(
            outcome=reply.outcome.value,
            status=reply.status,
            run_id=reply.run_id,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
            instance=instance_id(),
        )
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
            return Reply(413, Outcome.REJECTED, f"body over {c.MAX_BODY_BYTES} bytes")
        auth = self.authenticator.authenticate(
            AuthRequest(delivery.authorization, delivery.url), spec
        )
        log["caller"] = auth.principal
        if not auth.allowed:
            retry_after = c.STORE_UNAVAILABLE_RETRY_AFTER if auth.status == 503 else None
            return Reply(
                auth.status, _AUTH_OUTCOMES[auth.status], auth.reason, retry_after=retry_after
            )
        try:
            identity = parse_identity(
                delivery.kind,
                spec.name,
                delivery.header,
                delivery.query,
                project_header=self.project_header,
                location_header=self.location_header,
            )
        except InvalidDelivery as exc:
            return Reply(400, Outcome.REJECTED, str(exc))
        log.update(_identity_fields(identity))
        return self._claim_and_run(spec, identity, delivery.body, log)

    def _claim_and_run(
        self, spec: HandlerSpec, identity: DeliveryIdentity, body: bytes, log: dict[str, Any]
    ) -> Reply:
        run_id = identity.run_id
        request = ClaimRequest(
            run_id=run_id,
            kind=identity.kind.value,
            handler=spec.name,
            attempt_id=uuid.uuid4().hex,
            lease=spec.lease,
            retention=spec.retention,
            identity=identity.fields(),
        )
        try:
            claim = self.store.claim(request, self.clock())
        except StoreUnavailable as exc:
            return Reply(
                503,
                Outcome.UNAVAILABLE,
                f"lease store unavailable: {exc}",
                run_id,
                retry_after=c.STORE_UNAVAILABLE_RETRY_AFTER,
            )
        record = claim.record
        log.update(
            attempt_id=record.attempt_id,
            attempt=record.attempts,
            fencing_token=record.fencing_token,
        )
        if claim.verdict is Verdict.COMPLETED:
            return Reply(
                200,
                Outcome.DUPLICATE,
                "already completed",
                run_id,
                {"status": record.status.value, "result": record.result},
            )
        if claim.verdict is Verdict.FAILED:
            return Reply(
                200,
                Outcome.DUPLICATE,
                "already failed permanently",
                run_id,
                {"status": record.status.value, "error": record.error},
            )
        if claim.verdict is Verdict.IN_PROGRESS:
            remaining = (record.lease_expires - self.clock()).total_seconds()
            return Reply(
                409,
                Outcome.IN_PROGRESS,
                "another attempt holds the lease",
                run_id,
                retry_after=max(1, int(remaining + 0.999)),
            )
        if claim.took_over_from:
            log["took_over_from"] = claim.took_over_from
        ctx = _context(spec, identity, record, body)
        return self._run(spec, ctx, body)

    def _run(self, spec: HandlerSpec, ctx: TaskContext, body: bytes) -> Reply:
        if spec.max_attempts is not None and ctx.attempt > spec.max_attempts:
            error = f"gave up after {spec.max_attempts} attempts (max_attempts)"
            return self._fail(ctx, error, body)
        payload: Any = None
        if spec.kind is Kind.TASK:
            try:
                payload = decode_payload(body)
            except ValueError as exc:
                return self._fail(ctx, f"payload is not valid JSON: {exc}", body)
        try:
            with self.lease_keeper.kept(ctx, spec.lease):
                if spec.kind is Kind.TASK:
                    result = spec.function(payload, ctx)
                else:
                    result = spec.function(ctx)
        except PermanentFailure as exc:
            return self._fail(ctx, f"PermanentFailure: {exc}", body)
        except LeaseLost as exc:
            return Reply(409, Outcome.LOST_CLAIM, str(exc), ctx.run_id)
        except Exception as exc:
            logging.getLogger("tasklease.handler").exception(
                "handler %s raised; releasing run %s for a retry", spec.name, ctx.run_id
            )
            error = f"{type(exc).__name__}: {exc}"
            return self._finish(
                ctx,
                lambda: self.store.release(ctx.run_id, ctx.attempt_id, error, self.clock()),
                Reply(
                    500,
                    Outcome.RELEASED,
                    f"handler raised {type(exc).__name__}; released for a retry",
                    ctx.run_id,
                ),
            )
        # Capped once here, for the store and the answer alike (the store's own cap is then a
        # no-op that keeps direct callers safe).
        kept = decisions.cap_result(result)
        return self._finish(
            ctx,
            lambda: self.store.complete(ctx.run_id, ctx.attempt_id, kept, self.clock()),
            Reply(200, Outcome.PROCESSED, "processed", ctx.run_id, {"result": kept}),
        )

    def _fail(self, ctx: TaskContext, error: str, body: bytes) -> Reply:
        payload = body.decode("utf-8", errors="backslashreplace")
        return self._finish(
            ctx,
            lambda: self.store.fail(ctx.run_id, ctx.attempt_id, error, self.clock(), payload),
            Reply(200, Outcome.FAILED, error, ctx.run_id, {"status": "failed"}),
        )

    def _finish(self, ctx: TaskContext, write: Callable[[], bool], reply: Reply) -> Reply:
        """Record how the execution ended, only while this attempt still holds the claim."""
        for pause in (*FINISH_RETRY_PAUSES, None):
            try:
                held = write()
                break
            except StoreUnavailable as exc:
                if pause is None:
                    # The record stays in progress until its lease expires; then a retry runs.
                    return Reply(
                        503,
                        Outcome.UNRECORDED,
                        f"could not record the outcome ({reply.outcome.value}): {exc}",
                        ctx.run_id,
                        retry_after=c.STORE_UNAVAILABLE_RETRY_AFTER,
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
    if identity.kind is Kind.TASK:
        fields.update(retry_count=identity.retry_count, execution_count=identity.execution_count)
    return fields
