"""The emulator as one object: REST API, dispatcher, scheduler, OIDC keys, durable state."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tasks_v2
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from emulator import guard
from emulator import metrics as emulator_metrics
from emulator.api import CERTS_PATH, CloudTasksApi
from emulator.db import DeliveryRecord, EmulatorDB
from emulator.dispatcher import Dispatcher
from emulator.faults import Faults
from emulator.oidc import TokenIssuer
from emulator.scheduler import Job, LocalScheduler
from emulator.sender import Sender

DEFAULT_DEDUP_WINDOW = 3600.0  # Seconds a task name stays taken after it ran or was deleted.


class CloudTasksEmulator:
    """A local, faithful Cloud Tasks (and Cloud Scheduler) on 127.0.0.1.

    Start it in-process for tests (``with CloudTasksEmulator() as emulator:``) or with
    ``tasklease emulator``. Point the producer at :attr:`url` (``TASKLEASE_TASKS_ENDPOINT``)
    and the worker at :attr:`certs_url` (``TASKLEASE_OIDC_CERTS_URL``).

    It answers only requests whose Host is loopback, ``host`` or one of ``allowed_hosts``,
    and state-changing calls only in JSON (see :mod:`emulator.guard`).
    """

    def __init__(
        self,
        *,
        data_dir: Path | str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
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
        self.api = CloudTasksApi(self.db, self.dispatcher, self.issuer, dedup_window)
        app = self.api.app()
        emulator_metrics.install(app)
        app.add_url_rule(
            "/emulator/scheduler/jobs/<name>:run", "run_job", self._run_job, methods=["POST"]
        )
        guard.install(app, guard.allowed_host_names(host, allowed_hosts))
        self._server: BaseWSGIServer = make_server(
            host, port, app, threaded=True, request_handler=_QuietRequestHandler
        )
        # A wildcard bind is reached (and its Host checked) as 127.0.0.1.
        reach = "127.0.0.1" if host in guard.WILDCARD_HOSTS else host
        reach = f"[{reach}]" if ":" in reach else reach
        self.url = f"http://{reach}:{self._server.server_port}"
        self.certs_url = self.url + CERTS_PATH
        self._serving: threading.Thread | None = None

    def start(self) -> CloudTasksEmulator:
        self._serving = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="emulator-http", daemon=True
        )
        self._serving.start()
        self.dispatcher.start()
        self.scheduler.start()
        return self

    def stop(self) -> None:
        self.scheduler.stop()
        self.dispatcher.stop()
        self._server.shutdown()
        self._server.server_close()
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

    def client(self) -> Any:
        """A ``CloudTasksClient`` for this emulator (REST, anonymous credentials)."""
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

    def _run_job(self, name: str) -> tuple[dict[str, str], int]:
        """``tasklease scheduler run JOB``: like ``gcloud scheduler jobs run``."""
        if name not in self.scheduler.jobs:
            return {"error": f"no scheduler job {name!r}"}, 404
        self.scheduler.run_job(name)
        return {"job": name, "status": "triggered"}, 200

    def deliveries(self, queue: str | None = None) -> list[DeliveryRecord]:
        """Every HTTP request sent to a target so far, in order, with its status code."""
        return self.db.deliveries(queue)


class _QuietRequestHandler(WSGIRequestHandler):
    """No access log line per API call: the delivery log is the emulator's record."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return None
