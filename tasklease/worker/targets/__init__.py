"""Built-in proxy targets: Google Cloud APIs a Cloud Scheduler job starts once per run.

Scheduler calling ``*.googleapis.com`` directly starts a new execution on every retry (the API
ignores Scheduler's headers). Declared with :meth:`tasklease.worker.Router.proxy_job`, a target is a
scheduled handler instead: it claims the run like any other, passes the run's key downstream,
and on a retry adopts the execution an earlier attempt started before it starts another.
"""

from tasklease.worker.targets.base import ProxyTarget, Started
from tasklease.worker.targets.cloud_build import CloudBuildTrigger, cloud_build_trigger
from tasklease.worker.targets.cloud_run import CloudRunJob, cloud_run_job
from tasklease.worker.targets.workflows import WorkflowsExecution, workflows_execution

__all__ = [
    "CloudBuildTrigger",
    "CloudRunJob",
    "ProxyTarget",
    "Started",
    "WorkflowsExecution",
    "cloud_build_trigger",
    "cloud_run_job",
    "workflows_execution",
]
