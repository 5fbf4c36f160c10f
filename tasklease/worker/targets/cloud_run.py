"""Run a Cloud Run job once per scheduled run."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
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

_JOB = re.compile(r"projects/[^/]+/locations/[^/]+/jobs/[^/]+")
KEY_ENV = "TASKLEASE_IDEMPOTENCY_KEY"
SCHEDULE_TIME_ENV = "TASKLEASE_SCHEDULE_TIME"


class CloudRunJob(ProxyTarget[Any]):
    """Runs a Cloud Run job (RunJob, v2) with the run's key in an environment override.

    RunJob takes no labels, so the key travels as ``TASKLEASE_IDEMPOTENCY_KEY`` (and the slot
    as ``TASKLEASE_SCHEDULE_TIME``) in a container override, where the job's code can read it.
    The v2 ListExecutions has no filter: a retry reads the job's newest executions (at most
    ``max_scan``) and adopts the one whose template carries the key.
    """

    kind = "run"
    module = "google.cloud.run_v2"
    emulator_env = "TASKLEASE_RUN_EMULATOR_HOST"

    def __init__(
        self,
        job: str,
        *,
        container: str = "",
        args: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        task_count: int | None = None,
        task_timeout: timedelta | None = None,
        client: Any = None,
        executions_client: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_scan: int = DEFAULT_MAX_SCAN,
    ) -> None:
        if not _JOB.fullmatch(job):
            raise ConfigurationError(f"{job!r}: expected projects/P/locations/L/jobs/J")
        env = dict(env or {})
        if {KEY_ENV, SCHEDULE_TIME_ENV} & env.keys():
            raise ConfigurationError(f"{job}: {KEY_ENV} and {SCHEDULE_TIME_ENV} are reserved")
        if task_count is not None and task_count < 1:
            raise ConfigurationError(f"{job}: task_count must be at least 1")
        super().__init__(job, client, timeout)
        self.container = container
        self.args = list(args) if args is not None else None
        self.env = env
        self.task_count = task_count
        self.task_timeout = task_timeout
        self.max_scan = max_scan
        self._executions_client = executions_client

    def default_client(self) -> Any:
        run = self.library()
        host = os.environ.get(self.emulator_env)
        if host:
            transport = run.services.jobs.transports.JobsGrpcTransport(
                channel=loopback_channel(host)
            )
            return run.JobsClient(transport=transport)
        return run.JobsClient()

    def executions_client(self) -> Any:
        """The ExecutionsClient for look-ups: given, or built like the jobs client."""
        with self._lock:
            if self._executions_client is None:
                run = self.library()
                host = os.environ.get(self.emulator_env)
                if host:
                    transport = run.services.executions.transports.ExecutionsGrpcTransport(
                        channel=loopback_channel(host)
                    )
                    self._executions_client = run.ExecutionsClient(transport=transport)
                else:
                    self._executions_client = run.ExecutionsClient()
            return self._executions_client

    def overrides_for(self, ctx: TaskContext) -> Any:
        """The RunJob overrides: the given ones, plus the run's key as environment."""
        run = self.library()
        schedule_time = ctx.schedule_time.isoformat() if ctx.schedule_time else ""
        env = {**self.env, KEY_ENV: ctx.idempotency_key, SCHEDULE_TIME_ENV: schedule_time}
        container = run.RunJobRequest.Overrides.ContainerOverride(
            name=self.container,
            env=[run.EnvVar(name=name, value=value) for name, value in env.items()],
        )
        if self.args is not None:
            container.args = self.args
            container.clear_args = not self.args
        overrides = run.RunJobRequest.Overrides(container_overrides=[container])
        if self.task_count is not None:
            overrides.task_count = self.task_count
        if self.task_timeout is not None:
            overrides.timeout = self.task_timeout
        return overrides

    def start(self, ctx: TaskContext) -> Started:
        run = self.library()
        request = run.RunJobRequest(name=self.resource, overrides=self.overrides_for(ctx))
        operation = self.client().run_job(request=request, retry=None, timeout=self.timeout)
        # The operation's metadata is the new Execution; the job itself may run for hours,
        # so the operation is not waited for.
        execution = operation.metadata
        name = execution.name if execution is not None and execution.name else None
        return Started(name or operation.operation.name, operation.operation.name)

    def find(self, ctx: TaskContext) -> Started | None:
        pages = self.executions_client().list_executions(parent=self.resource, timeout=self.timeout)
        for seen, execution in enumerate(pages):
            if seen >= self.max_scan:
                break
            if any(
                env.name == KEY_ENV and env.value == ctx.idempotency_key
                for container in execution.template.containers
                for env in container.env
            ):
                return Started(execution.name)
        return None


def cloud_run_job(
    job: str,
    *,
    container: str = "",
    args: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    task_count: int | None = None,
    task_timeout: timedelta | None = None,
    client: Any = None,
    executions_client: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> CloudRunJob:
    """A proxy target that runs ``projects/P/locations/L/jobs/J`` once per run.

    ``args``/``env``/``task_count``/``task_timeout`` become RunJob overrides (``container``
    names the container they apply to; empty: the job's only one). ``client``: a ready
    ``google.cloud.run_v2.JobsClient``; ``executions_client``: a ready ``ExecutionsClient``
    for the look-up on retries (default: like ``client``, with Application Default
    Credentials). Needs ``tasklease[run]``.
    """
    return CloudRunJob(
        job,
        container=container,
        args=args,
        env=env,
        task_count=task_count,
        task_timeout=task_timeout,
        client=client,
        executions_client=executions_client,
        timeout=timeout,
    )
