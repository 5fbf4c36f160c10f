"""What an enqueue can fail with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tasklease.errors import TaskleaseError

if TYPE_CHECKING:
    from tasklease.producer.producer import EnqueueResult


class EnqueueError(TaskleaseError):
    """Base class: the task was not (known to be) created."""


class InvalidTask(EnqueueError, ValueError):
    """The task was refused before any network call: fix the call."""


class TaskAlreadyExists(EnqueueError):
    """Raised by a transport: a task with this name exists or existed recently.

    The producer turns it into ``EnqueueResult(created=False)``: a duplicate, not an error.
    """


class TransientEnqueueError(EnqueueError):
    """Raised by a transport for errors worth retrying (unavailable, deadline, rate limit, 5xx)."""


class PermanentEnqueueError(EnqueueError):
    """Retrying cannot help (queue not found, permission denied, invalid argument)."""


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
