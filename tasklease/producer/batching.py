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

from tasklease.producer.attempts import Sent, Tries, settle
from tasklease.producer.errors import EnqueueError
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


class BatchRound:
    """One ``enqueue_many`` call's batches and the results they settle, in item order; the
    sync and async senders run it, this decides."""

    def __init__(self, items: Sequence[tuple[str | None, TaskRequest]], size: int) -> None:
        self.items = items
        self.requests = [request for _, request in items]
        self.batches, repeats = plan(self.requests, size)
        self.call = uuid.uuid4().hex
        self.results: list[EnqueueResult | None] = [None] * len(items)
        # (index, attempts already made) of the items to create one by one.
        self.later: list[tuple[int, int]] = [(index, 0) for index in repeats]

    def batch(self, batch: Sequence[int]) -> tuple[list[TaskRequest], str]:
        """The tasks of ``batch`` and its ``request_id``."""
        tasks = [self.requests[index] for index in batch]
        return tasks, request_id([task.name for task in tasks], self.call)

    def record(self, batch: Sequence[int], sent: Sent) -> None:
        """Settle the items of a sent batch; those it left uncertain go to :attr:`later`."""
        for index in batch:
            key, request = self.items[index]
            result = settle(request, key, sent)
            if result is None:
                self.later.append((index, sent.attempts))
            self.results[index] = result
        self.later.sort()

    def single(self, entry: tuple[int, int]) -> tuple[TaskRequest, str | None, int]:
        """What creating a :attr:`later` entry on its own takes: request, key, attempts."""
        key, request = self.items[entry[0]]
        return request, key, entry[1]

    def finished(self, singles: Sequence[EnqueueResult]) -> list[EnqueueResult]:
        """Every item's result, given those of :attr:`later` in its order."""
        for (index, _), result in zip(self.later, singles, strict=True):
            self.results[index] = result
        return [result for result in self.results if result is not None]


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
        batches = BatchRound(items, self.transport.max_batch_size)

        def send(batch: list[int]) -> Sent:
            return self._send(*batches.batch(batch))

        with ThreadPoolExecutor(min(concurrency, len(batches.batches)), "tasklease-batch") as pool:
            for batch, sent in zip(batches.batches, pool.map(send, batches.batches), strict=True):
                batches.record(batch, sent)
        if not batches.later:
            return batches.finished([])

        def single(entry: tuple[int, int]) -> EnqueueResult:
            return create_one(*batches.single(entry))

        with ThreadPoolExecutor(min(concurrency, len(batches.later)), "tasklease-enqueue") as pool:
            return batches.finished(list(pool.map(single, batches.later)))

    def _send(self, tasks: Sequence[TaskRequest], batch_id: str) -> Sent:
        """One batch, its transient faults retried with the same ``request_id``."""
        tries = Tries(self.retry)
        while not isinstance(step := tries.batch(tasks, self._answer(tasks, batch_id)), Sent):
            self.sleep(step)
        return step

    def _answer(self, tasks: Sequence[TaskRequest], batch_id: str) -> BatchOutcome | EnqueueError:
        try:
            return self.transport.create_tasks(tasks, batch_id, self.timeout)
        except EnqueueError as exc:
            return exc
