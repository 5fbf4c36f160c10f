"""Run a router under gunicorn (or uvicorn) in a child process: for ``tasklease dev``, the demo
and tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import requests

from tasklease import protocol


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class GunicornWorker:
    """``gunicorn tasklease.worker.wsgi:app`` for ``router`` (``module:attribute``) on 127.0.0.1;
    with ``server="uvicorn"``, uvicorn serving ``tasklease.worker.asgi:app_from_env`` instead
    (:mod:`tasklease.worker.asgi_serve`, what the uvicorn Procfile runs)
    (or ``asgi_factory``; ``threads`` deliveries at once per process; ``extra_args`` go to
    the server chosen).

    With ``auth="oidc"``, ``TASKLEASE_AUDIENCE`` defaults to the server's own URL.
    Use as a context manager: it starts, waits until ``/healthz`` answers, and stops the
    server (SIGTERM, then SIGKILL) on exit.
    """

    def __init__(
        self,
        router: str,
        *,
        store: str,
        auth: str = "none",
        workers: int = 2,
        threads: int = 8,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        stream_logs: bool = False,
        extra_args: Sequence[str] = (),
        own_session: bool = False,
        server: str = "gunicorn",
        asgi_factory: str = "tasklease.worker.asgi:app_from_env",
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = server
        if server == "gunicorn":
            self._command = [
                sys.executable, "-m", "gunicorn",
                "--bind", f"127.0.0.1:{self.port}",
                "--workers", str(workers),
                "--threads", str(threads),
                "--timeout", "0",
                "--graceful-timeout", "5",
                "--limit-request-field_size", str(protocol.MAX_TASK_HEADER_BYTES),
                *extra_args,
                "tasklease.worker.wsgi:app",
            ]  # fmt: skip
        elif server == "uvicorn":
            self._command = [
                sys.executable, "-m", "tasklease.worker.asgi_serve", asgi_factory,
                "--host", "127.0.0.1",
                "--port", str(self.port),
                "--workers", str(workers),
                "--timeout-graceful-shutdown", "5",
                "--no-access-log",
                *extra_args,
            ]  # fmt: skip
        else:
            raise ValueError(f"server={server!r}: gunicorn or uvicorn")
        # A session of its own: a terminal's Ctrl-C reaches the caller alone, which stops it.
        self._own_session = own_session
        self._env = {
            **os.environ,
            protocol.ENV_ROUTER: router,
            protocol.ENV_STORE: store,
            protocol.ENV_AUTH: auth,
            "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
            protocol.ENV_ASGI_THREADS: str(threads),
            **(env or {}),
        }
        if auth == "oidc":
            # The URL this server answers on is the only audience its tokens may carry.
            self._env.setdefault(protocol.ENV_AUDIENCE, self.url)
        self._log_path = log_path
        self._stream_logs = stream_logs  # Inherit stdout/stderr (``tasklease dev``).
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Self:
        if self._log_path:
            with open(self._log_path, "ab") as log:  # The child keeps its own descriptor.
                self._process = subprocess.Popen(
                    self._command,
                    env=self._env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=self._own_session,
                )
        else:
            quiet = None if self._stream_logs else subprocess.DEVNULL
            self._process = subprocess.Popen(
                self._command,
                env=self._env,
                stdout=quiet,
                stderr=None if self._stream_logs else subprocess.STDOUT,
                start_new_session=self._own_session,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"{self.server} exited with {self._process.returncode}; see its log"
                )
            try:
                requests.get(f"{self.url}/healthz", timeout=1)
            except requests.RequestException:
                time.sleep(0.1)
            else:
                return self
        self.stop()
        raise RuntimeError(f"{self.server} did not answer on {self.url} within {timeout} s")

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def kill(self) -> None:
        """SIGKILL the server and, in a session of its own, its workers with it: nothing
        is left to report their deaths (gunicorn's "Perhaps out of memory?")."""
        if self._process is None or self._process.poll() is not None:
            return
        if self._own_session:
            os.killpg(self._process.pid, signal.SIGKILL)
        else:
            self._process.kill()
        self._process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
