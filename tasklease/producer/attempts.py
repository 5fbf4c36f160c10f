"""What one create attempt means, for the sync and the async producer alike. Pure: the
callers make the call and the pause; these decide what comes of each answer.

An attempt ends in a result, or in the pause before the next try (a float); a transient
error after the last allowed try, and any error retrying cannot change, is raised.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tasklease.producer.errors import EnqueueError, TaskAlreadyExists, TransientEnqueueError
from tasklease.producer.results import EnqueueResult
from tasklease.producer.retry import RetryPolicy
from tasklease.producer.transport import BatchOutcome, TaskRequest


class Tries:
    """The tries of one create or one batch: count them and decide on each answer."""

    def __init__(self, retry: RetryPolicy, attempts: int = 0) -> None:
        self.delays = retry.delays()
        self.attempts = attempts  # Tries already made (in a batch that left it uncertain).

    def create(
        self, request: TaskRequest, key: str | None, error: EnqueueError | None
    ) -> EnqueueResult | float:
        """The next try of a single create ended with ``error`` (None: created)."""
        self.attempts += 1
        return after_create(request, key, self.attempts, error, self.delays)

    def batch(
        self, tasks: Sequence[TaskRequest], answer: BatchOutcome | EnqueueError
    ) -> Sent | float:
        """The next try of a batch answered ``answer``."""
        self.attempts += 1
        return after_batch(tasks, self.attempts, answer, self.delays)


def after_create(
    request: TaskRequest,
    key: str | None,
    attempts: int,
    error: EnqueueError | None,
    delays: Iterator[float],
) -> EnqueueResult | float:
    """A single create's ``attempts``-th try ended with ``error`` (None: created)."""
    if error is None:
        return EnqueueResult(request.name, request.task_id, key, True, attempts)
    if isinstance(error, TaskAlreadyExists):
        # After a transient failure, the earlier attempt may have created it.
        return EnqueueResult(request.name, request.task_id, key, attempts > 1, attempts)
    if isinstance(error, TransientEnqueueError):
        pause = next(delays, None)
        if pause is not None:
            return pause
        raise TransientEnqueueError(
            f"gave up creating {request.name} after {attempts} attempts: {error}"
        ) from error
    raise error


@dataclass(frozen=True)
class Sent:
    """How one batch ended: its outcome, or the error of the whole batch."""

    outcome: BatchOutcome
    attempts: int
    error: EnqueueError | None = None


def after_batch(
    tasks: Sequence[TaskRequest],
    attempts: int,
    answer: BatchOutcome | EnqueueError,
    delays: Iterator[float],
) -> Sent | float:
    """A batch's ``attempts``-th try answered ``answer``; its transient faults are retried
    (with the same ``request_id``), any other fault settles the batch."""
    if isinstance(answer, BatchOutcome):
        return Sent(answer, attempts)
    if isinstance(answer, TransientEnqueueError):
        pause = next(delays, None)
        if pause is not None:
            return pause
        error = TransientEnqueueError(
            f"gave up creating a batch of {len(tasks)} tasks in {tasks[0].queue_path}"
            f" after {attempts} attempts: {answer}"
        )
        return Sent(BatchOutcome(), attempts, error)
    if isinstance(answer, TaskAlreadyExists):
        return Sent(BatchOutcome(), attempts)  # Of the batch? Each task on its own.
    return Sent(BatchOutcome(), attempts, answer)


def settle(request: TaskRequest, key: str | None, sent: Sent) -> EnqueueResult | None:
    """The task's result from its batch; None when the batch left it uncertain."""
    name, attempts = request.name, sent.attempts
    if sent.error is not None:
        return EnqueueResult(name, request.task_id, key, False, attempts, sent.error)
    if name in sent.outcome.created:
        return EnqueueResult(name, request.task_id, key, True, attempts)
    if name in sent.outcome.existed:
        # Not as after a retried single create: a batch retried with its request_id gets
        # the first operation's answer back, the batch's only execution, so "existed" means
        # the task was there before the batch, whatever the attempt count.
        return EnqueueResult(name, request.task_id, key, False, attempts)
    error = sent.outcome.failed.get(name)
    if error is not None:
        return EnqueueResult(name, request.task_id, key, False, attempts, error)
    return None


def failed_result(
    request: TaskRequest, key: str | None, attempts: int, error: EnqueueError
) -> EnqueueResult:
    """An item of ``enqueue_many`` whose create failed: its error in the result."""
    return EnqueueResult(request.name, request.task_id, key, False, attempts, error)
