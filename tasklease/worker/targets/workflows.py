"""Start a Workflows execution once per scheduled run."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from google.api_core import exceptions as api_exceptions

from tasklease.errors import ConfigurationError, PermanentFailure
from tasklease.worker.handlers.context import TaskContext
from tasklease.worker.targets.base import DEFAULT_TIMEOUT, ProxyTarget, Started, loopback_channel

_WORKFLOW = re.compile(r"projects/[^/]+/locations/[^/]+/workflows/[^/]+")
# Label keys and values: at most 63 lowercase letters, digits, '_' and '-'; keys start with a
# letter. The key (a UUID) fits, and labels are what ListExecutions can filter on.
KEY_LABEL = "tasklease_key"
ARGUMENT_KEY = "tasklease"
MAX_ARGUMENT_BYTES = 32 * 1024  # The API's limit on an execution's argument.
_FULL_PAGE = 100  # ListExecutions' largest page in the FULL view (the only view with arguments).


class WorkflowsExecution(ProxyTarget[Any]):
    """Creates an execution of a workflow, its argument carrying the run's key.

    The argument is the given JSON object plus ``{"tasklease": {"idempotency_key": ...,
    "schedule_time": ...}}``, so the workflow can pass the key on; the execution also carries
    the label ``tasklease_key=<key>``, which a retry filters ListExecutions on (in the FULL
    view, the only one that returns arguments) before it adopts a match.
    """

    kind = "workflows"
    module = "google.cloud.workflows.executions_v1"
    emulator_env = "TASKLEASE_WORKFLOWS_EMULATOR_HOST"

    def __init__(
        self,
        workflow: str,
        *,
        argument: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
        client: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_scan: int = 1000,
    ) -> None:
        if not _WORKFLOW.fullmatch(workflow):
            raise ConfigurationError(f"{workflow!r}: expected projects/P/locations/L/workflows/W")
        argument = dict(argument or {})
        if ARGUMENT_KEY in argument:
            raise ConfigurationError(f"{workflow}: the argument key {ARGUMENT_KEY!r} is reserved")
        try:
            json.dumps(argument)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"{workflow}: argument is not JSON: {exc}") from exc
        labels = dict(labels or {})
        if KEY_LABEL in labels:
            raise ConfigurationError(f"{workflow}: the label {KEY_LABEL!r} is reserved")
        super().__init__(workflow, client, timeout)
        self.argument = argument
        self.labels = labels
        self.max_scan = max_scan

    def default_client(self) -> Any:
        executions = self.library()
        host = os.environ.get(self.emulator_env)
        if host:
            transport = executions.services.executions.transports.ExecutionsGrpcTransport(
                channel=loopback_channel(host)
            )
            return executions.ExecutionsClient(transport=transport)
        return executions.ExecutionsClient()

    def argument_for(self, ctx: TaskContext) -> str:
        """The execution's argument: the given object with the run's key merged in."""
        schedule_time = ctx.schedule_time.isoformat() if ctx.schedule_time else None
        argument = {
            **self.argument,
            ARGUMENT_KEY: {"idempotency_key": ctx.idempotency_key, "schedule_time": schedule_time},
        }
        text = json.dumps(argument, separators=(",", ":"))
        if len(text.encode()) > MAX_ARGUMENT_BYTES:
            raise PermanentFailure(f"{self.resource}: argument over {MAX_ARGUMENT_BYTES} bytes")
        return text

    def start(self, ctx: TaskContext) -> Started:
        executions = self.library()
        execution = executions.Execution(
            argument=self.argument_for(ctx),
            labels={**self.labels, KEY_LABEL: ctx.idempotency_key},
        )
        created = self.client().create_execution(
            parent=self.resource, execution=execution, retry=None, timeout=self.timeout
        )
        return Started(created.name)

    def find(self, ctx: TaskContext) -> Started | None:
        try:
            return self._find(ctx, f'labels.{KEY_LABEL}="{ctx.idempotency_key}"')
        except api_exceptions.InvalidArgument:
            # The label filter follows AIP-160 and the API's documented "label" field, but is
            # not checked against Google: if it is refused, read the newest executions.
            return self._find(ctx, "")

    def _find(self, ctx: TaskContext, filter_: str) -> Started | None:
        executions = self.library()
        request = executions.ListExecutionsRequest(
            parent=self.resource,
            view=executions.ExecutionView.FULL,
            filter=filter_,
            page_size=_FULL_PAGE,
        )
        pages = self.client().list_executions(request=request, timeout=self.timeout)
        for seen, execution in enumerate(pages):
            if seen >= self.max_scan:
                break
            if carried_key(execution.argument) == ctx.idempotency_key:
                return Started(execution.name)
        return None


def carried_key(argument: str) -> str | None:
    """The run key an execution's argument carries, if it carries one."""
    try:
        value = json.loads(argument or "null")
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get(ARGUMENT_KEY), dict):
        return None
    key = value[ARGUMENT_KEY].get("idempotency_key")
    return key if isinstance(key, str) else None


def workflows_execution(
    workflow: str,
    *,
    argument: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    client: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> WorkflowsExecution:
    """A proxy target that starts ``projects/P/locations/L/workflows/W`` once per run.

    ``client``: a ready ``google.cloud.workflows.executions_v1.ExecutionsClient`` (default:
    one with Application Default Credentials). Needs ``tasklease[workflows]``.
    """
    return WorkflowsExecution(
        workflow, argument=argument, labels=labels, client=client, timeout=timeout
    )
