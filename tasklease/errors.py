"""What tasklease raises, under one root, and the two signals a handler raises to the worker.

Everything tasklease raises for a failure is a :class:`TaskleaseError`::

    TaskleaseError
    ├── ConfigurationError         a setting or option is inconsistent (also a ValueError)
    ├── InvalidDelivery            a request carries no valid Cloud Tasks / Scheduler identity
    ├── StoreUnavailable           the lease store failed; nothing was claimed or changed
    ├── FanInGone                  a join's results were asked for after it expired
    ├── Cancelled                  the run was cancelled (tasklease.cancel): raised at the
    │                              handler's next ctx.step, so it stops
    ├── OperationRefused           an operator action does not apply to the run or lock
    ├── WriterLockTimeout          another process held the SQLite writer lock too long
    ├── NotInTransaction           an outbox entry's transaction would not hold it (also a
    │                              ValueError; tasklease.outbox)
    ├── EnqueueError               a task was not (known to be) created (tasklease.producer)
    │   ├── InvalidTask            refused before any network call (also a ValueError)
    │   ├── TaskAlreadyExists      the name exists or existed recently
    │   ├── TransientEnqueueError  worth retrying
    │   ├── PermanentEnqueueError  retrying cannot help
    │   └── FanOutIncomplete       some children of a fan-out were not created
    ├── ApiError                   the local emulator's answer in Google's error shape
    └── DeployError                the deploy kit cannot go on (tasklease.deploy)

A handler's signals are not failures of tasklease and stand apart, as a task queue's
control-flow exceptions do: raise :class:`PermanentFailure` to stop the queue's retries with a
dead letter; :class:`LeaseLost` is what :meth:`TaskContext.check_lease` raises once another
attempt took the run over.
"""

from __future__ import annotations

__all__ = [
    "Cancelled",
    "ConfigurationError",
    "FanInGone",
    "InvalidDelivery",
    "LeaseLost",
    "PermanentFailure",
    "StoreUnavailable",
    "TaskleaseError",
]


class TaskleaseError(Exception):
    """The root of everything tasklease raises for a failure (the tree is in the module's
    docstring)."""


class ConfigurationError(TaskleaseError, ValueError):
    """tasklease was configured inconsistently (a bad option, an unknown store URL, ...)."""


class InvalidDelivery(TaskleaseError, ValueError):
    """The request does not carry a valid Cloud Tasks or Cloud Scheduler identity."""


class StoreUnavailable(TaskleaseError):
    """The lease store could not be reached or failed; nothing was claimed or changed."""


class FanInGone(TaskleaseError, LookupError):
    """A join's results were asked for (``ctx.fan_in_results``) after the store let it go."""


class Cancelled(TaskleaseError):
    """The run was cancelled (``tasklease.cancel``) while this attempt ran it: raised by the
    handler's next ``ctx.step`` / ``ctx.astep`` once the attempt has seen the cancellation
    (``ctx.cancelled``). Whatever the handler does then (lets it propagate, catches it,
    returns), the run ends ``cancelled``, never retried."""


class PermanentFailure(Exception):
    """Raise from a handler when retrying cannot help.

    The run is recorded as failed with this message (a dead-letter record to inspect and
    replay), and the worker answers 200 so that the queue stops retrying.
    """


class LeaseLost(Exception):
    """The execution no longer holds its claim: another attempt took the run over.

    Raised by :meth:`tasklease.worker.TaskContext.check_lease` so long handlers can stop early.
    """
