"""tasklease: run every Cloud Tasks task and Cloud Scheduler run exactly once in effect.

The everyday API, importable from the top::

    from tasklease import Producer, Router, TaskContext, create_app

    router = Router()

    @router.task("send_receipt")
    def send_receipt(payload, ctx: TaskContext): ...

    app = create_app(router)                      # the worker, served by gunicorn
    Producer.from_env().enqueue("send_receipt", {"order_id": 42}, key="order-42")

Names are imported on first use, so ``import tasklease`` stays cheap: a worker does not pay for
the producer's Cloud Tasks client, and a producer does not pay for Flask. The subpackages are
:mod:`tasklease.worker` (with ``stores`` and ``targets``), :mod:`tasklease.producer`,
:mod:`tasklease.emulator`, :mod:`tasklease.deploy` and :mod:`tasklease.testing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasklease.lazy import lazy_exports

__version__ = "0.1.0"

if TYPE_CHECKING:
    from tasklease.errors import Cancelled, TaskleaseError
    from tasklease.producer import (
        AsyncProducer,
        EnqueueError,
        EnqueueResult,
        FanOutIncomplete,
        InvalidTask,
        PermanentEnqueueError,
        Producer,
        RetryPolicy,
        TaskAlreadyExists,
        TransientEnqueueError,
        task_id,
    )
    from tasklease.worker import (
        ConfigurationError,
        HandlerSpec,
        InvalidDelivery,
        JobRetry,
        LeaseLost,
        NoAuth,
        OidcAuth,
        Outcome,
        PermanentFailure,
        Router,
        RunRecord,
        RunStatus,
        StoreUnavailable,
        TaskContext,
        create_app,
    )
    from tasklease.worker.handlers.waits import WaitTimedOut
    from tasklease.worker.operate.cancels import cancel
    from tasklease.worker.operate.signals import signal
    from tasklease.worker.stores import LeaseStore, MemoryStore, SqliteStore, store_from_url

# Each public name and the module that defines it (imported when the name is first read).
_EXPORTS: dict[str, str] = {
    "Cancelled": "tasklease.errors",
    "cancel": "tasklease.worker.operate.cancels",
    "ConfigurationError": "tasklease.errors",
    "InvalidDelivery": "tasklease.errors",
    "LeaseLost": "tasklease.errors",
    "PermanentFailure": "tasklease.errors",
    "StoreUnavailable": "tasklease.errors",
    "TaskleaseError": "tasklease.errors",
    "HandlerSpec": "tasklease.worker.handlers.spec",
    "JobRetry": "tasklease.worker.handlers.spec",
    "Router": "tasklease.worker.handlers.router",
    "TaskContext": "tasklease.worker.handlers.context",
    "Outcome": "tasklease.worker.core.outcome",
    "RunRecord": "tasklease.worker.core.records",
    "RunStatus": "tasklease.worker.core.records",
    "NoAuth": "tasklease.worker.auth.authenticators",
    "OidcAuth": "tasklease.worker.auth.authenticators",
    "create_app": "tasklease.worker.serving.app",
    "WaitTimedOut": "tasklease.worker.handlers.waits",
    "signal": "tasklease.worker.operate.signals",
    "LeaseStore": "tasklease.worker.stores",
    "MemoryStore": "tasklease.worker.stores",
    "SqliteStore": "tasklease.worker.stores",
    "store_from_url": "tasklease.worker.stores",
    "EnqueueError": "tasklease.producer.errors",
    "FanOutIncomplete": "tasklease.producer.results",
    "InvalidTask": "tasklease.producer.errors",
    "PermanentEnqueueError": "tasklease.producer.errors",
    "TaskAlreadyExists": "tasklease.producer.errors",
    "TransientEnqueueError": "tasklease.producer.errors",
    "EnqueueResult": "tasklease.producer.results",
    "Producer": "tasklease.producer.producer",
    "AsyncProducer": "tasklease.producer.async_producer",
    "RetryPolicy": "tasklease.producer.retry",
    "task_id": "tasklease.producer.naming",
}

__all__ = [
    "AsyncProducer",
    "Cancelled",
    "ConfigurationError",
    "EnqueueError",
    "EnqueueResult",
    "FanOutIncomplete",
    "HandlerSpec",
    "InvalidDelivery",
    "InvalidTask",
    "JobRetry",
    "LeaseLost",
    "LeaseStore",
    "MemoryStore",
    "NoAuth",
    "OidcAuth",
    "Outcome",
    "PermanentEnqueueError",
    "PermanentFailure",
    "Producer",
    "RetryPolicy",
    "Router",
    "RunRecord",
    "RunStatus",
    "SqliteStore",
    "StoreUnavailable",
    "TaskAlreadyExists",
    "TaskContext",
    "TaskleaseError",
    "TransientEnqueueError",
    "WaitTimedOut",
    "__version__",
    "cancel",
    "create_app",
    "signal",
    "store_from_url",
    "task_id",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
