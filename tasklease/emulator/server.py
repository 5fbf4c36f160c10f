"""The emulator as one object: REST and gRPC APIs, dispatcher, scheduler, OIDC keys, durable
state."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from tasklease.emulator import guard, rest, scheduler_grpc
from tasklease.emulator import metrics as emulator_metrics
from tasklease.emulator.api import CERTS_PATH, DEFAULT_QUEUE_REUSE_WINDOW, CloudTasksApi
from tasklease.emulator.batch import BatchApi, grpc_handlers
from tasklease.emulator.db import EmulatorDB
from tasklease.emulator.dispatcher import Dispatcher
from tasklease.emulator.faults import Faults
from tasklease.emulator.grpc_api import GrpcServer
from tasklease.emulator.http_server import HttpServer
from tasklease.emulator.oidc import TokenIssuer
from tasklease.emulator.rows import DeliveryRecord
from tasklease.emulator.scheduler import Job, LocalScheduler
from tasklease.emulator.scheduler_api import SchedulerApi
from tasklease.emulator.sender import Sender

DEFAULT_DEDUP_WINDOW = 3600.0  # Seconds a task name stays taken after it ran or was deleted.


class CloudTasksEmulator:
    """A local, faithful Cloud Tasks (and Cloud Scheduler) on 127.0.0.1.

    One port serves the Cloud Tasks v2 REST API (``/v2``), the Cloud Scheduler v1 REST API
    (``/v1``, jobs kept in the same database) and the OIDC keys; jobs also come from
    ``jobs`` (the TOML file) at start-up.

    Start it in-process for tests (``with CloudTasksEmulator() as emulator:``) or with
    ``tasklease emulator``. Point the producer at :attr:`url` (``TASKLEASE_TASKS_ENDPOINT``)
    and the worker at :attr:`certs_url` (``TASKLEASE_OIDC_CERTS_URL``). The same API is
    served over gRPC on 127.0.0.1 at :attr:`grpc_target`, Cloud Scheduler too: ``grpc_port``
    (default: the REST port + 1, or any free port when ``port`` is 0).

    It answers only requests whose Host is loopback, ``host`` or one of ``allowed_hosts``,
    and state-changing calls only in JSON (see :mod:`tasklease.emulator.guard`).
    """

    def __init__(
        self,
        *,
        data_dir: Path | str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        grpc_port: int | None = None,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
        queue_reuse_window: float = DEFAULT_QUEUE_REUSE_WINDOW,
        faults: Faults | None = None,
        jobs: Iterable[Job] = (),
        scheduler_on_schedule: bool = True,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self._tempdir = None
        if data_dir is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="tasklease-emulator-")
            data_dir = self._tempdir.name
        self.data_dir = Path(data_dir)
        self.faults = faults or Faults()
        self.db = EmulatorDB(self.data_dir / "emulator.db")
        emulator_metrics.watch(self.db)
        self.issuer = TokenIssuer(self.data_dir / "oidc-key.pem")
        self._sender = Sender(self.faults)
        self.dispatcher = Dispatcher(self.db, self.issuer, self._sender, dedup_window=dedup_window)
        self.scheduler = LocalScheduler(
            jobs, self.db, self.issuer, self._sender, on_schedule=scheduler_on_schedule
        )
        self.api = CloudTasksApi(
            self.db, self.dispatcher, self.issuer, dedup_window, queue_reuse_window
        )
        self.batch_api = BatchApi(self.api, self.db)
        self.scheduler_api = SchedulerApi(self.db, self.scheduler)
        self.scheduler_api.load()  # Jobs made through the API before a restart.
        app = rest.create_app(self.api, self.scheduler_api, self.issuer, self.batch_api)
        emulator_metrics.install(app)
        app.add_url_rule(
            "/emulator/scheduler/jobs/<name>:run", "run_job", self._run_job, methods=["POST"]
        )
        guard.install(app, guard.allowed_host_names(host, allowed_hosts))
        self._server = HttpServer(app, host, port)
        # A wildcard bind is reached (and its Host checked) as 127.0.0.1.
        reach = "127.0.0.1" if host in guard.WILDCARD_HOSTS else host
        reach = f"[{reach}]" if ":" in reach else reach
        self.url = f"http://{reach}:{self._server.port}"
        self.certs_url = self.url + CERTS_PATH
        if grpc_port is None:
            grpc_port = self._server.port + 1 if port else 0
        self._grpc = GrpcServer(
            self.api,
            grpc_port,
            services=[
                scheduler_grpc.handler(self.scheduler_api),
                *grpc_handlers(self.batch_api),
            ],
        )
        self.grpc_port = self._grpc.port
        self.grpc_target = self._grpc.target  # host:port, for grpc.insecure_channel.

    def start(self) -> CloudTasksEmulator:
        self._server.start()
        self._grpc.start()
        self.dispatcher.start()
        self.scheduler.start()
        return self

    def stop(self) -> None:
        self.scheduler.stop()
        self.dispatcher.stop()
        self._grpc.stop()
        self._server.stop()
        self._sender.close()
        emulator_metrics.unwatch(self.db)
        self.db.close()
        if self._tempdir is not None:
            self._tempdir.cleanup()

    def __enter__(self) -> CloudTasksEmulator:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def client(self, transport: str = "rest") -> Any:
        """A ``CloudTasksClient`` for this emulator: ``"rest"`` (anonymous credentials) or
        ``"grpc"`` (an insecure channel)."""
        if transport == "grpc":
            channel = grpc.insecure_channel(self.grpc_target)
            return tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
        return tasks_v2.CloudTasksClient(
            transport="rest",
            client_options=ClientOptions(api_endpoint=self.url),
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        )

    def create_queue(self, queue_path: str, **settings: Any) -> dict[str, Any]:
        """Create a queue directly (REST JSON settings such as ``retryConfig``)."""
        parent = queue_path.rsplit("/queues/", 1)[0]
        return self.api.create_queue(parent, {"name": queue_path, **settings})

    def join(self, queue: str | None = None, timeout: float = 60.0) -> None:
        """Wait until ``queue`` (or every queue) has no task left, pending or in flight."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.db.count_tasks(queue) == 0 and self.dispatcher.in_flight(queue) == 0:
                return
            time.sleep(0.02)
        raise TimeoutError(f"{self.db.count_tasks(queue)} tasks still queued after {timeout} s")

    def _run_job(self, name: str) -> tuple[dict[str, str | list[str]], int]:
        """``tasklease scheduler run JOB``: like ``gcloud scheduler jobs run``."""
        if name not in self.scheduler.jobs:
            return {"error": f"no scheduler job {name!r}", "jobs": sorted(self.scheduler.jobs)}, 404
        self.scheduler.run_job(name)
        return {"job": name, "status": "triggered"}, 200

    def deliveries(self, queue: str | None = None) -> list[DeliveryRecord]:
        """Every HTTP request sent to a target so far, in order, with its status code."""
        return self.db.deliveries(queue)
