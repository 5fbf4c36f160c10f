"""The deploy kit's one error: what its command line reports, exiting 2."""

from __future__ import annotations

from tasklease.errors import TaskleaseError


class DeployError(TaskleaseError):
    """A configuration that cannot work, or a gcloud call that failed."""
