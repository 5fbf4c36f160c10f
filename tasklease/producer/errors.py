"""What an enqueue can fail with (FanOutIncomplete, which carries results, is in results.py)."""

from __future__ import annotations

from tasklease.errors import TaskleaseError


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
