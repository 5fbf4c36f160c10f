"""Exceptions a handler raises, and the ones the worker raises internally."""

from __future__ import annotations


class PermanentFailure(Exception):
    """Raise from a handler when retrying cannot help.

    The run is recorded as failed with this message (a dead-letter record to inspect and
    replay), and the worker answers 200 so that the queue stops retrying.
    """


class LeaseLost(Exception):
    """The execution no longer holds its claim: another attempt took the run over.

    Raised by :meth:`tasklease.worker.TaskContext.check_lease` so long handlers can stop early.
    """


class InvalidDelivery(ValueError):
    """The request does not carry a valid Cloud Tasks or Cloud Scheduler identity."""


class StoreUnavailable(Exception):
    """The lease store could not be reached or failed; nothing was claimed or changed."""


class ConfigurationError(ValueError):
    """The worker was configured inconsistently (bad option, unknown store URL, ...)."""
