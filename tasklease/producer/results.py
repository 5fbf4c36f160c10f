"""How enqueues ended: one result per task, and the fan-out error that carries them.

Apart from errors.py so that the producer and its errors do not import each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tasklease.producer.errors import EnqueueError


@dataclass(frozen=True)
class EnqueueResult:
    """How one enqueue ended.

    ``created`` is False when Cloud Tasks already had the name: a duplicate enqueue absorbed,
    not an error. In ``enqueue_many`` results, ``error`` is set for an item that failed (the
    call can be repeated as a whole: names make that safe). With ``transaction=``, nothing is
    created yet: ``staged`` says an outbox entry was written through the transaction (False:
    that name was staged before), and the relay creates the task after the commit.
    """

    name: str
    task_id: str
    key: str | None
    created: bool
    attempts: int
    error: EnqueueError | None = None
    staged: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


class FanOutIncomplete(EnqueueError):
    """Some children of a fan-out were not created; every other child was tried.

    Raised out of a scheduled handler it releases the run, so the Scheduler's retry fans out
    again: the children's names make the created ones come back ``created=False`` and only the
    missing ones get created. ``failed_keys`` names the item keys that failed; ``results``
    holds one result per item, in order.
    """

    def __init__(self, results: Sequence[EnqueueResult], failed_keys: Sequence[str]) -> None:
        self.results = list(results)
        self.failed_keys = list(failed_keys)
        first = next(result.error for result in self.results if result.error is not None)
        shown = ", ".join(self.failed_keys[:10]) + (" ..." if len(self.failed_keys) > 10 else "")
        super().__init__(
            f"{len(self.failed_keys)} of {len(self.results)} fan-out tasks not created "
            f"(keys: {shown}); first error: {first}"
        )
