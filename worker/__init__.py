"""tasklease worker: run each Cloud Tasks task and Cloud Scheduler run exactly once in effect.

Register handlers on a :class:`Router`, serve them with :func:`create_app`::

    router = Router()

    @router.task("send_receipt")
    def send_receipt(payload, ctx: TaskContext): ...

    app = create_app(router, store=SqliteStore("runs.db"), auth="none")
"""

from worker.app import create_app
from worker.auth import Authenticator, AuthRequest, AuthResult, NoAuth, OidcAuth
from worker.context import TaskContext
from worker.errors import (
    ConfigurationError,
    InvalidDelivery,
    LeaseLost,
    PermanentFailure,
    StoreUnavailable,
)
from worker.outcome import Outcome
from worker.records import RunRecord, RunStatus
from worker.router import HandlerSpec, Router

__all__ = [
    "AuthRequest",
    "AuthResult",
    "Authenticator",
    "ConfigurationError",
    "HandlerSpec",
    "InvalidDelivery",
    "LeaseLost",
    "NoAuth",
    "OidcAuth",
    "Outcome",
    "PermanentFailure",
    "Router",
    "RunRecord",
    "RunStatus",
    "StoreUnavailable",
    "TaskContext",
    "create_app",
]
