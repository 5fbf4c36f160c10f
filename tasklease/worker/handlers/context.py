"""What a handler learns about the execution it runs in: a read-only view of its attempt."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tasklease.worker.core.identity import DeliveryIdentity, Kind, parse_rfc3339
from tasklease.worker.core.records import RunRecord
from tasklease.worker.handlers.attempt import Attempt
from tasklease.worker.handlers.fan_outs import FanOuts, ProducerSource
from tasklease.worker.handlers.steps import DurableSteps, StepRunner
from tasklease.worker.handlers.waits import DurableWaits


@dataclass(frozen=True, eq=False, init=False)
class TaskContext(DurableSteps, DurableWaits, FanOuts):
    """One execution of a task or scheduled run, as the handler sees it.

    ``fencing_token`` grows with every new claim of the same run: pass it to downstream
    writes so they can reject a stale attempt whose lease was taken over. ``idempotency_key``
    is the same for every attempt of the run, shaped as a UUID because Google Cloud APIs'
    ``request_id`` fields require one. ``lease_expires``, ``lock`` and ``lock_fencing_token``
    and the lease checks read the attempt's live state, which only the executor and the lease
    keeper change.
    """

    kind: str
    handler: str
    run_id: str
    attempt_id: str
    fencing_token: int
    attempt: int  # Claims of this run so far, this one included: our own count.
    body: bytes
    queue: str | None
    task_name: str | None
    retry_count: int | None
    execution_count: int | None
    eta: datetime | None
    previous_response: int | None
    retry_reason: str | None
    job_name: str | None
    schedule_time: datetime | None
    project: str | None
    location: str | None
    fan_in_of: str | None  # In a join's then handler: the join (see fan_in_results).
    _live: Attempt = field(repr=False)
    _steps: StepRunner = field(repr=False)
    _producers: ProducerSource | None = field(repr=False)

    def __init__(  # noqa: PLR0917 - the arguments (and order) it always took.
        self,
        kind: str,
        handler: str,
        run_id: str,
        attempt_id: str,
        fencing_token: int,
        attempt: int,
        lease_expires: datetime,
        body: bytes = b"",
        queue: str | None = None,
        task_name: str | None = None,
        retry_count: int | None = None,
        execution_count: int | None = None,
        eta: datetime | None = None,
        previous_response: int | None = None,
        retry_reason: str | None = None,
        job_name: str | None = None,
        schedule_time: datetime | None = None,
        project: str | None = None,
        location: str | None = None,
        lock: str | None = None,
        lock_fencing_token: int | None = None,
        *,
        live: Attempt | None = None,
        steps: StepRunner | None = None,
        producers: ProducerSource | None = None,
        fan_in_of: str | None = None,
    ) -> None:
        """``live``: the executor's attempt, which this view reads (the lease and lock given
        are then its own); ``producers``: the router ``fan_out`` enqueues through. Without
        ``live``, as in a handler's unit test, the view reads an attempt of its own, started
        with the lease and lock given."""
        if live is None:
            live = Attempt(
                kind, handler, run_id, attempt_id, lease_expires, lock, lock_fencing_token
            )
        # Frozen: set once here, past the frozen __setattr__.
        self.__dict__.update(
            kind=kind,
            handler=handler,
            run_id=run_id,
            attempt_id=attempt_id,
            fencing_token=fencing_token,
            attempt=attempt,
            body=body,
            queue=queue,
            task_name=task_name,
            retry_count=retry_count,
            execution_count=execution_count,
            eta=eta,
            previous_response=previous_response,
            retry_reason=retry_reason,
            job_name=job_name,
            schedule_time=schedule_time,
            project=project,
            location=location,
            fan_in_of=fan_in_of,
            _live=live,
            _steps=steps if steps is not None else StepRunner(run_id, live),
            _producers=producers,
        )

    @property
    def lease_expires(self) -> datetime:
        """When the lease this attempt last confirmed expires (the store's clock)."""
        return self._live.lease_expires

    @property
    def lock(self) -> str | None:
        """The lock this execution holds (an exclusive job's, or its concurrency key's),
        renewed and released with the run."""
        return self._live.lock

    @property
    def lock_fencing_token(self) -> int | None:
        """The held lock's fencing token: it grows with every holder of the lock."""
        return self._live.lock_fencing_token

    @property
    def transaction(self) -> Any:
        """The store's native transaction this run's completion record will be written in
        (a handler registered with ``transactional=True``): a ``sqlite3.Connection`` (SQLite),
        psycopg ``Connection`` (Postgres), Spanner or Firestore ``Transaction``, each wrapped
        so that the handler cannot end the transaction (RuntimeError). Write the
        handler's database effects through it: they are kept exactly when the run completes.

        Inside a transactional step's function, that step's transaction (the ``tx`` it is
        given). Raises RuntimeError in any other handler, and outside the handler's call.
        """
        transaction = self._live.current_transaction
        if transaction is None:
            raise RuntimeError(
                f"ctx.transaction: handler {self.handler!r} does not run in a transaction; "
                "register it with transactional=True (on a store that supports it) to get one"
            )
        return transaction

    @property
    def idempotency_key(self) -> str:
        """Stable across retries of this run; a UUID-shaped string derived from the run id."""
        return str(uuid.UUID(self.run_id[:32]))

    @property
    def lease_lost(self) -> bool:
        """True once a renewal found the run taken over, or once the lease this attempt last
        confirmed has run out by the local monotonic clock, whatever the store would say: an
        instance cut off from its store must stop before another may take the run over."""
        return self._live.lease_lost

    @property
    def lease_seconds_left(self) -> float:
        """Seconds until the confirmed lease runs out by the local clock (0 once lost)."""
        return self._live.lease_seconds_left

    def check_lease(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost; call it between steps."""
        self._live.check_lease()

    @property
    def cancelled(self) -> bool:
        """True once this attempt has seen its run cancelled (``tasklease.cancel``), at a
        step's write or a lease renewal: the next :meth:`step` raises
        :class:`~tasklease.errors.Cancelled`, and the run ends ``cancelled`` however the
        handler ends, never retried. Long work between steps may poll it to stop early."""
        return self._live.cancelled


def view_of(
    live: Attempt,
    identity: DeliveryIdentity,
    record: RunRecord,
    body: bytes,
    steps: StepRunner | None = None,
    *,
    producers: ProducerSource | None = None,
) -> TaskContext:
    """The handler's view of the attempt ``live``, claimed for ``identity`` as ``record``.
    A scheduled run's continuation (a Cloud Tasks task) sees the job and schedule time of
    the run it resumes, from its record."""
    job_name, schedule_time = identity.job_name, identity.schedule_time
    project, location = identity.project, identity.location
    if identity.continues is not None:
        # The run's own, as its first delivery named them: the producer puts a project and
        # location on every task it creates, Cloud Scheduler sends none, and the locks of
        # an exclusive job or a concurrency key are named from them.
        project, location = record.identity.get("project"), record.identity.get("location")
        if identity.kind is Kind.SCHEDULER:
            job_name = record.identity.get("job_name")
            schedule_time = parse_rfc3339(record.identity.get("schedule_time", ""))
    return TaskContext(
        kind=live.kind,
        handler=live.handler,
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
        job_name=job_name,
        schedule_time=schedule_time,
        project=project,
        location=location,
        live=live,
        steps=steps,
        producers=producers,
        fan_in_of=identity.fan_in_of,
    )
