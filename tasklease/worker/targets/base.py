"""What every built-in proxy target shares: look for an earlier start on a retry, start once,
and sort the API's errors into dead letters and retries."""

from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Generic, TypeVar

import grpc
from google.api_core import exceptions as api_exceptions

from tasklease.errors import ConfigurationError, PermanentFailure
from tasklease.worker.handlers.context import TaskContext

_Client = TypeVar("_Client")

# Default seconds for one API call; a scheduled job's attempt_deadline is 15 s to 30 min.
DEFAULT_TIMEOUT = 30.0
# How many of the newest executions or builds a retry looks through where the API cannot
# filter on the key itself (Cloud Run jobs; Cloud Build, past its trigger_id filter).
DEFAULT_MAX_SCAN = 500

# 4xx answers that a retry of the same request cannot change: the run becomes a dead letter.
# 401 (credentials mid-refresh), 409 and 429 are left to the retry path.
_PERMANENT = (
    api_exceptions.BadRequest,  # INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE
    api_exceptions.Forbidden,  # PERMISSION_DENIED
    api_exceptions.NotFound,
    api_exceptions.MethodNotAllowed,
)


@dataclass(frozen=True)
class Started:
    """An execution (or build) of the target, started by this run or found on a retry."""

    name: str
    operation: str | None = None


class ProxyTarget(ABC, Generic[_Client]):
    """A Google Cloud API that a scheduled job starts at most once per run.

    Subclasses implement :meth:`start` (make the one call, carrying ``ctx.idempotency_key``
    downstream) and :meth:`find` (the execution an earlier attempt of this run started, by that
    key). Calling the target runs it as a scheduled handler: :meth:`Router.proxy_job
    <tasklease.worker.Router.proxy_job>` registers it. Unless a client is given, one is built on
    first use (after gunicorn forks), once per target: with Application Default Credentials, or over
    plaintext gRPC to the loopback host:port named by :attr:`emulator_env` when that is set.
    """

    kind: str  # "workflows", "run" or "build": also the name of the extra to install.
    module: str  # The client library, imported on first use.
    emulator_env: str  # Names a loopback host:port to reach over plaintext gRPC instead.

    def __init__(
        self,
        resource: str,
        client: _Client | None,
        timeout: float,
    ) -> None:
        if timeout <= 0:
            raise ConfigurationError(f"{resource}: timeout must be positive")
        self.resource = resource
        self.timeout = timeout
        self._client: _Client | None = client
        self._lock = threading.Lock()

    def __call__(self, ctx: TaskContext) -> dict[str, Any]:
        """The scheduled handler: adopt an earlier attempt's execution, or start one."""
        with api_errors(f"{self.kind} {self.resource}"):
            if ctx.attempt > 1:
                # An earlier claim of this run (a retry, or a takeover of an expired lease)
                # may have started an execution and died before recording it.
                found = self.find(ctx)
                if found is not None:
                    return self._result(found, adopted=True)
            ctx.check_lease()  # A stale attempt must not start what its successor may start.
            return self._result(self.start(ctx), adopted=False)

    @abstractmethod
    def start(self, ctx: TaskContext) -> Started:
        """Start one execution carrying ``ctx.idempotency_key``, with no automatic retry."""

    @abstractmethod
    def find(self, ctx: TaskContext) -> Started | None:
        """The execution already started with ``ctx.idempotency_key``, if any."""

    def client(self) -> _Client:
        """The API client: the one given, or one built on first use."""
        with self._lock:
            if self._client is None:
                self._client = self.default_client()
            return self._client

    @abstractmethod
    def default_client(self) -> _Client:
        """A client with Application Default Credentials (or the loopback emulator)."""

    def library(self) -> ModuleType:
        """The client library's module, with an install hint when the extra is missing."""
        return import_library(self.module, self.kind)

    def _result(self, started: Started, *, adopted: bool) -> dict[str, Any]:
        result: dict[str, Any] = {
            "target": self.kind,
            "resource": self.resource,
            "name": started.name,
            "adopted": adopted,
        }
        if started.operation:
            result["operation"] = started.operation
        return result


def import_library(module: str, extra: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(
            f"this proxy target needs {module}: pip install 'tasklease[{extra}]'"
        ) from exc


@contextmanager
def api_errors(what: str) -> Iterator[None]:
    """A 4xx that a retry cannot change becomes :class:`PermanentFailure` (a dead letter,
    answered 200); anything else propagates, so the run is released and retried."""
    try:
        yield
    except _PERMANENT as exc:
        raise PermanentFailure(f"{what}: {exc}") from exc


def loopback_channel(host: str) -> Any:
    """A plaintext gRPC channel to an emulator; refuses anything but a loopback address."""
    hostname = host.rpartition(":")[0].strip("[]")
    if hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ConfigurationError(f"emulator host {host!r}: only loopback addresses are allowed")
    return grpc.insecure_channel(host)
