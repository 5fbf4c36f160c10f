"""Many tasks in few calls: batches of one queue, several in flight, each task settled once.

A batch's ``request_id`` is derived from its task names and the ``enqueue_many`` call, so the
producer's own retry of a batch (a lost answer) names the same operation, while a later call
with the same names (a fan-out's retry) is a new operation: Cloud Tasks would answer an old
``request_id`` with the first operation's results (docs/platform-facts.md, "Cloud Tasks:
BatchCreateTasks"), where the names' own de-duplication gives the exact ``created`` flags.
Tasks a batch answer leaves uncertain, and repeats of a name within the call, are created one
by one after the batches.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tasklease.producer.errors import EnqueueError, TaskAlreadyExists, TransientEnqueueError
from tasklease.producer.results import EnqueueResult
from tasklease.producer.retry import RetryPolicy
from tasklease.producer.transport import BatchOutcome, TaskRequest, TaskTransport

# (request, key, attempts already made for it) -> its result, errors included.
CreateOne = Callable[[TaskRequest, str | None, int], EnqueueResult]


def plan(requests: Sequence[TaskRequest], size: int) -> tuple[list[list[int]], list[int]]:
    """Indexes grouped by queue into batches of at most ``size``, in order; and the indexes
    whose name an earlier item already has (a batch holds each name once)."""
    seen: set[str] = set()
    by_queue: dict[str, list[int]] = {}
    repeats: list[int] = []
    for index, request in enumerate(requests):
        if request.name in seen:
            repeats.append(index)
            continue
        seen.add(request.name)
        by_queue.setdefault(request.queue_path, []).append(index)
    batches = [
        indexes[start : start + size]
        for indexes in by_queue.values()
        for start in range(0, len(indexes), size)
    ]
    return batches, repeats


def request_id(names: Sequence[str], call: str) -> str:
    """A UUID (the form the field's documentation names) from the call and the batch's names."""
    digest = hashlib.sha256("\n".join([call, *names]).encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


@dataclass(frozen=True)
class _Sent:
    """How one batch ended: its outcome, or the error of the whole batch."""

    outcome: BatchOutcome
    attempts: int
    error: EnqueueError | None = None


@dataclass
class BatchSender:
    """Sends the batches of one ``enqueue_many`` call."""

    transport: TaskTransport
    retry: RetryPolicy
    timeout: float
    sleep: Callable[[float], None]

    def create_many(
        self,
        items: Sequence[tuple[str | None, TaskRequest]],
        concurrency: int,
        create_one: CreateOne,
    ) -> list[EnqueueResult]:
        requests = [request for _, request in items]
        batches, repeats = plan(requests, self.transport.max_batch_size)
        call = uuid.uuid4().hex
        results: list[EnqueueResult | None] = [None] * len(items)
        later = [(index, 0) for index in repeats]

        def send(batch: list[int]) -> _Sent:
            tasks = [requests[index] for index in batch]
            return self._send(tasks, request_id([task.name for task in tasks], call))

        with ThreadPoolExecutor(min(concurrency, len(batches)), "tasklease-batch") as pool:
            for batch, sent in zip(batches, pool.map(send, batches), strict=True):
                for index in batch:
                    key, request = items[index]
                    result = _settle(request, key, sent)
                    if result is None:
                        later.append((index, sent.attempts))
                    results[index] = result
        if later:

            def single(entry: tuple[int, int]) -> EnqueueResult:
                key, request = items[entry[0]]
                return create_one(request, key, entry[1])

            later.sort()
            with ThreadPoolExecutor(min(concurrency, len(later)), "tasklease-enqueue") as pool:
                for (index, _), result in zip(later, pool.map(single, later), strict=True):
                    results[index] = result
        return [result for result in results if result is not None]

    def _send(self, tasks: Sequence[TaskRequest], batch_id: str) -> _Sent:
        """One batch, its transient faults retried with the same ``request_id``."""
        delays = self.retry.delays()
        attempts = 0
        while True:
            attempts += 1
            try:
                return _Sent(self.transport.create_tasks(tasks, batch_id, self.timeout), attempts)
            except TransientEnqueueError as exc:
                pause = next(delays, None)
                if pause is None:
                    error = TransientEnqueueError(
                        f"gave up creating a batch of {len(tasks)} tasks in {tasks[0].queue_path}"
                        f" after {attempts} attempts: {exc}"
                    )
                    return _Sent(BatchOutcome(), attempts, error)
                self.sleep(pause)
            except TaskAlreadyExists:
                return _Sent(BatchOutcome(), attempts)  # Of the batch? Each task on its own.
            except EnqueueError as exc:
                return _Sent(BatchOutcome(), attempts, exc)


def _settle(request: TaskRequest, key: str | None, sent: _Sent) -> EnqueueResult | None:
    """The task's result from its batch; None when the batch left it uncertain."""
    name, attempts = request.name, sent.attempts
    if sent.error is not None:
        return EnqueueResult(name, request.task_id, key, False, attempts, sent.error)
    if name in sent.outcome.created:
        return EnqueueResult(name, request.task_id, key, True, attempts)
    if name in sent.outcome.existed:
        # After our own retried batch, the earlier attempt may have created it.
        return EnqueueResult(name, request.task_id, key, attempts > 1, attempts)
    error = sent.outcome.failed.get(name)
    if error is not None:
        return EnqueueResult(name, request.task_id, key, False, attempts, error)
    return None
