"""Run a Cloud Build trigger once per scheduled run."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from tasklease.errors import ConfigurationError
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.targets.base import (
    DEFAULT_MAX_SCAN,
    DEFAULT_TIMEOUT,
    ProxyTarget,
    Started,
    loopback_channel,
)

_TRIGGER = re.compile(
    r"projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/triggers/(?P<id>[^/]+)"
)
# User-defined substitutions start with '_' and hold upper-case letters, digits and '_'.
_SUBSTITUTION = re.compile(r"_[A-Z0-9_]+")
KEY_SUBSTITUTION = "_TASKLEASE_IDEMPOTENCY_KEY"
SCHEDULE_TIME_SUBSTITUTION = "_TASKLEASE_SCHEDULE_TIME"


class CloudBuildTrigger(ProxyTarget[Any]):
    """Runs a build trigger (RunBuildTrigger, v1) with the run's key as a substitution.

    The build gets ``_TASKLEASE_IDEMPOTENCY_KEY`` (and ``_TASKLEASE_SCHEDULE_TIME``): the
    trigger must declare both, or allow loose substitutions, or Cloud Build refuses the build.
    A retry lists the trigger's builds (``trigger_id="..."``, newest first, at most
    ``max_scan``) and adopts the one whose substitutions carry the key.
    """

    kind = "build"
    module = "google.cloud.devtools.cloudbuild_v1"
    emulator_env = "TASKLEASE_BUILD_EMULATOR_HOST"

    def __init__(
        self,
        trigger: str,
        *,
        substitutions: Mapping[str, str] | None = None,
        branch: str | None = None,
        tag: str | None = None,
        commit: str | None = None,
        client: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_scan: int = DEFAULT_MAX_SCAN,
    ) -> None:
        match = _TRIGGER.fullmatch(trigger)
        if match is None:
            raise ConfigurationError(f"{trigger!r}: expected projects/P/locations/L/triggers/T")
        substitutions = dict(substitutions or {})
        for name in substitutions:
            if not _SUBSTITUTION.fullmatch(name):
                raise ConfigurationError(f"{trigger}: substitution {name!r} must match _[A-Z0-9_]+")
        if {KEY_SUBSTITUTION, SCHEDULE_TIME_SUBSTITUTION} & substitutions.keys():
            raise ConfigurationError(f"{trigger}: the _TASKLEASE_* substitutions are reserved")
        if sum(value is not None for value in (branch, tag, commit)) > 1:
            raise ConfigurationError(f"{trigger}: give at most one of branch, tag and commit")
        super().__init__(trigger, client, timeout)
        self.project = match["project"]
        self.location = match["location"]
        self.trigger_id = match["id"]
        self.substitutions = substitutions
        self.branch, self.tag, self.commit = branch, tag, commit
        self.max_scan = max_scan

    def default_client(self) -> Any:
        build = self.library()
        host = os.environ.get(self.emulator_env)
        if host:
            transport = build.services.cloud_build.transports.CloudBuildGrpcTransport(
                channel=loopback_channel(host)
            )
            return build.CloudBuildClient(transport=transport)
        return build.CloudBuildClient()

    def source_for(self, ctx: TaskContext) -> Any:
        """The RepoSource of the run: the given revision and substitutions, plus the key."""
        build = self.library()
        schedule_time = ctx.schedule_time.isoformat() if ctx.schedule_time else ""
        source = build.RepoSource(
            project_id=self.project,
            substitutions={
                **self.substitutions,
                KEY_SUBSTITUTION: ctx.idempotency_key,
                SCHEDULE_TIME_SUBSTITUTION: schedule_time,
            },
        )
        if self.branch is not None:
            source.branch_name = self.branch
        if self.tag is not None:
            source.tag_name = self.tag
        if self.commit is not None:
            source.commit_sha = self.commit
        return source

    def start(self, ctx: TaskContext) -> Started:
        build = self.library()
        request = build.RunBuildTriggerRequest(
            name=self.resource,
            project_id=self.project,
            trigger_id=self.trigger_id,
            source=self.source_for(ctx),
        )
        operation = self.client().run_build_trigger(
            request=request, retry=None, timeout=self.timeout
        )
        # BuildOperationMetadata holds the queued build; the build is not waited for.
        metadata = operation.metadata
        started = metadata.build if metadata is not None else None
        name = started.name if started is not None and started.name else None
        return Started(name or operation.operation.name, operation.operation.name)

    def find(self, ctx: TaskContext) -> Started | None:
        build = self.library()
        request = build.ListBuildsRequest(
            parent=f"projects/{self.project}/locations/{self.location}",
            project_id=self.project,
            filter=f'trigger_id="{self.trigger_id}"',
        )
        pages = self.client().list_builds(request=request, timeout=self.timeout)
        for seen, candidate in enumerate(pages):
            if seen >= self.max_scan:
                break
            if candidate.substitutions.get(KEY_SUBSTITUTION) == ctx.idempotency_key:
                return Started(
                    candidate.name
                    or f"projects/{self.project}/locations/{self.location}/builds/{candidate.id}"
                )
        return None


def cloud_build_trigger(
    trigger: str,
    *,
    substitutions: Mapping[str, str] | None = None,
    branch: str | None = None,
    tag: str | None = None,
    commit: str | None = None,
    client: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> CloudBuildTrigger:
    """A proxy target that runs ``projects/P/locations/L/triggers/T`` once per run.

    ``substitutions`` (user-defined, ``_NAME``) and one of ``branch``/``tag``/``commit`` go
    into the RunBuildTrigger source. ``client``: a ready
    ``google.cloud.devtools.cloudbuild_v1.CloudBuildClient`` (default: one with Application
    Default Credentials). Needs ``tasklease[build]``.
    """
    return CloudBuildTrigger(
        trigger,
        substitutions=substitutions,
        branch=branch,
        tag=tag,
        commit=commit,
        client=client,
        timeout=timeout,
    )
