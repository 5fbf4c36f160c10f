"""Proxy jobs: a ``[job.proxy]`` table names a Google Cloud API target the worker starts
(tasklease.worker.targets); what each kind of target may be, and what starting it needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What a proxy target may be, and what its starting needs. Scopes: "project" (the target's
# project; the API has no narrower resource that takes the role) or "job" (the Cloud Run job).
PROXY_KINDS = {
    "workflow": ("workflows", r"[A-Za-z][A-Za-z0-9_-]{0,127}"),
    "run_job": ("jobs", r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?"),
    "build_trigger": ("triggers", r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"),
}
PROXY_GRANTS: dict[str, tuple[tuple[str, str], ...]] = {
    # workflows.executions.create/get/list. Workflows roles are granted on projects only
    # (IAM's "lowest-level resource"; gcloud has no per-workflow IAM command).
    "workflow": (("project", "roles/workflows.invoker"),),
    # RunJob with overrides (the key is an env override) needs run.jobs.runWithOverrides,
    # which run.invoker lacks; the look-up on a retry lists the job's executions: a
    # read-only role on the same job.
    "run_job": (("job", "roles/run.jobsExecutorWithOverrides"), ("job", "roles/run.viewer")),
    # cloudbuild.builds.create and .list; build triggers take no IAM policy of their own.
    "build_trigger": (("project", "roles/cloudbuild.builds.editor"),),
}


@dataclass(frozen=True)
class Proxy:
    kind: str  # A key of PROXY_KINDS.
    resource: str  # projects/P/locations/L/<collection>/NAME

    @property
    def _parts(self) -> list[str]:
        return self.resource.split("/")

    @property
    def project(self) -> str:
        return self._parts[1]

    @property
    def location(self) -> str:
        return self._parts[3]

    @property
    def name(self) -> str:
        return self._parts[5]


def parse_proxy(raw: Any) -> Proxy | None:
    """``[job.proxy]``: exactly one of ``workflow``, ``run_job``, ``build_trigger``."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in PROXY_KINDS:
        raise ValueError(f"job.proxy must set exactly one of {', '.join(PROXY_KINDS)}: {raw!r}")
    [(kind, resource)] = raw.items()
    return Proxy(kind, resource)


# The client library each proxy target imports (worker.targets): a plain dependency of the
# source, since the buildpack installs no extras such as tasklease[workflows].
PROXY_LIBRARIES = {
    "workflow": "google-cloud-workflows",
    "run_job": "google-cloud-run",
    "build_trigger": "google-cloud-build",
}
