"""tasklease worker: run each Cloud Tasks task and Cloud Scheduler run exactly once in effect.

Register handlers on a :class:`Router`, serve them with :func:`create_app`::

    router = Router()

    @router.task("send_receipt")
    async def send_receipt(payload, ctx: TaskContext): ...  # sync or async def

    app = create_app(router, store=SqliteStore("runs.db"), auth="none")
    send_receipt.enqueue({"order_id": 42}, key="order-42")  # through router.producer()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasklease.lazy import lazy_exports

if TYPE_CHECKING:
    from tasklease.errors import (
        ConfigurationError,
        InvalidDelivery,
        LeaseLost,
        PermanentFailure,
        StoreUnavailable,
    )
    from tasklease.worker.auth.authenticators import (
        Authenticator,
        AuthRequest,
        AuthResult,
        NoAuth,
        OidcAuth,
    )
    from tasklease.worker.core.outcome import Outcome
    from tasklease.worker.core.records import RunRecord, RunStatus
    from tasklease.worker.core.steps import StepError
    from tasklease.worker.handlers.context import TaskContext
    from tasklease.worker.handlers.options import HandlerOptions, JobOptions
    from tasklease.worker.handlers.router import Router
    from tasklease.worker.handlers.spec import HandlerSpec, JobRetry
    from tasklease.worker.serving.app import create_app
    from tasklease.worker.serving.options import WorkerOptions

# Each public name and the module that defines it (imported when the name is first read).
_EXPORTS: dict[str, str] = {
    "create_app": "tasklease.worker.serving.app",
    "WorkerOptions": "tasklease.worker.serving.options",
    "Authenticator": "tasklease.worker.auth.authenticators",
    "AuthRequest": "tasklease.worker.auth.authenticators",
    "AuthResult": "tasklease.worker.auth.authenticators",
    "NoAuth": "tasklease.worker.auth.authenticators",
    "OidcAuth": "tasklease.worker.auth.authenticators",
    "TaskContext": "tasklease.worker.handlers.context",
    "ConfigurationError": "tasklease.errors",
    "InvalidDelivery": "tasklease.errors",
    "LeaseLost": "tasklease.errors",
    "PermanentFailure": "tasklease.errors",
    "StoreUnavailable": "tasklease.errors",
    "Outcome": "tasklease.worker.core.outcome",
    "RunRecord": "tasklease.worker.core.records",
    "RunStatus": "tasklease.worker.core.records",
    "StepError": "tasklease.worker.core.steps",
    "HandlerSpec": "tasklease.worker.handlers.spec",
    "JobRetry": "tasklease.worker.handlers.spec",
    "HandlerOptions": "tasklease.worker.handlers.options",
    "JobOptions": "tasklease.worker.handlers.options",
    "Router": "tasklease.worker.handlers.router",
}

__all__ = [
    "AuthRequest",
    "AuthResult",
    "Authenticator",
    "ConfigurationError",
    "HandlerOptions",
    "HandlerSpec",
    "InvalidDelivery",
    "JobOptions",
    "JobRetry",
    "LeaseLost",
    "NoAuth",
    "OidcAuth",
    "Outcome",
    "PermanentFailure",
    "Router",
    "RunRecord",
    "RunStatus",
    "StepError",
    "StoreUnavailable",
    "TaskContext",
    "WorkerOptions",
    "create_app",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
