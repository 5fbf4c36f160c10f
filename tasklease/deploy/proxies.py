"""Proxy jobs: a ``[job.proxy]`` table names a Google Cloud API target the worker starts
(tasklease.worker.targets); what each kind of target may be, and what starting it needs."""

from __future__ import annotations

# What each kind of proxy target may be is tasklease.jobs' (PROXY_KINDS, Proxy): the schema.
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


# The client library each proxy target imports (worker.targets): a plain dependency of the
# source, since the buildpack installs no extras such as tasklease[workflows].
PROXY_LIBRARIES = {
    "workflow": "google-cloud-workflows",
    "run_job": "google-cloud-run",
    "build_trigger": "google-cloud-build",
}
