"""Where the Spanner tests run: Google's Cloud Spanner emulator (gcloud's native
``cloud-spanner-emulator`` component), started once per test session on free loopback ports.

Clients find it through ``SPANNER_EMULATOR_HOST``; the instance is created through the client
(config ``emulator-config``), and each test gets a database of its own, dropped after it. In
CI (``CI=true``) a missing emulator fails the tests instead of skipping them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tasklease.plumbing.serve import free_port
from tests.support.process_groups import group_alive, group_states

PROJECT = "tasklease-test"
INSTANCE = "tasklease"
IN_CI = os.environ.get("CI") == "true"


class EmulatorDidNotStart(RuntimeError):
    pass


@dataclass(frozen=True)
class Emulator:
    """A running emulator: its gRPC host:port, and its process group (gcloud, the gateway
    and the emulator itself), which a test may freeze with SIGSTOP."""

    host: str
    group: int

    def freeze(self) -> None:
        """Stop every process of the group, and wait until the kernel shows them stopped
        (``killpg`` returns before the signal is delivered: a request may still get in)."""
        os.killpg(self.group, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not all(state == "T" for state in group_states(self.group).values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the emulator did not stop: {group_states(self.group)}")
            time.sleep(0.01)

    def thaw(self) -> None:
        os.killpg(self.group, signal.SIGCONT)


def start_emulator() -> Iterator[Emulator]:
    """The session's emulator, its instance created; fails in CI when it cannot start."""
    try:
        with run_emulator() as emulator:
            yield emulator
            return
    except EmulatorDidNotStart as exc:
        reason = str(exc)
    message = (
        f"no Spanner emulator ({reason}): install gcloud's cloud-spanner-emulator component "
        "(package google-cloud-cli-spanner-emulator)"
    )
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@contextmanager
def run_emulator(project: str = PROJECT) -> Iterator[Emulator]:
    """``gcloud emulators spanner start`` on free loopback ports (gRPC and REST), with a
    throwaway gcloud config; the whole process group is stopped afterwards."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise EmulatorDidNotStart("no gcloud on PATH")
    port, rest_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "CLOUDSDK_CONFIG": str(Path(tmp) / "gcloud"),
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
            "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "1",
            "CLOUDSDK_CORE_PROJECT": project,
        }
        log = Path(tmp) / "spanner-emulator.log"
        command = [
            gcloud,
            "emulators",
            "spanner",
            "start",
            f"--host-port=127.0.0.1:{port}",
            f"--rest-port={rest_port}",
            "--quiet",
        ]
        with log.open("wb") as output:  # The child keeps its own descriptor.
            process = subprocess.Popen(
                command,
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 60
            while "gRPC server listening" not in log.read_text() or not _accepts(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise EmulatorDidNotStart(
                        f"gcloud's emulator did not start: {log.read_text().strip()[-800:]}"
                    )
                time.sleep(0.1)
            host = f"127.0.0.1:{port}"
            create_instance(host, project)
            yield Emulator(host, process.pid)
        finally:
            stop_group(process)


def _accepts(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _client(host: str, project: str = PROJECT) -> Any:
    from google.cloud import spanner  # noqa: PLC0415 - the optional extra, on use only.

    previous = os.environ.get("SPANNER_EMULATOR_HOST")
    os.environ["SPANNER_EMULATOR_HOST"] = host
    try:
        return spanner.Client(project=project)
    finally:
        if previous is None:
            del os.environ["SPANNER_EMULATOR_HOST"]
        else:
            os.environ["SPANNER_EMULATOR_HOST"] = previous


def create_instance(host: str, project: str = PROJECT, instance: str = INSTANCE) -> None:
    client = _client(host, project)
    config = f"projects/{project}/instanceConfigs/emulator-config"
    client.instance(instance, configuration_name=config, node_count=1).create().result(30)


def create_database(host: str, project: str = PROJECT, instance: str = INSTANCE) -> str:
    """A new empty database: its path, ``projects/P/instances/I/databases/D``."""
    name = f"db-{uuid.uuid4().hex[:12]}"
    database = _client(host, project).instance(instance).database(name)
    database.create().result(30)
    return f"projects/{project}/instances/{instance}/databases/{name}"


def drop_database(host: str, path: str) -> None:
    _, project, _, instance, _, name = path.split("/")
    with suppress(Exception):  # The emulator may be gone already; nothing to keep then.
        _client(host, project).instance(instance).database(name).drop()


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop gcloud, the gateway and the emulator: the whole group, killed if it lingers (a
    frozen group gets SIGCONT first, or SIGTERM would wait)."""
    for sig in (signal.SIGCONT, signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        if sig is signal.SIGCONT:
            continue
        deadline = time.monotonic() + 10
        while group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not group_alive(process.pid):
            break
    process.wait(timeout=5)


class RpcCounter:
    """Counts the RPCs a store's Spanner client makes, by wrapping each method of its GAPIC
    transport: one count per RPC the client library issues (a retry of an RPC after
    UNAVAILABLE, inside the client's retry loop, would not count again; none happens here)."""

    METHODS = (
        "create_session",
        "batch_create_sessions",
        "begin_transaction",
        "commit",
        "rollback",
        "read",
        "streaming_read",
        "execute_sql",
        "execute_streaming_sql",
        "execute_batch_dml",
    )

    def __init__(self, database: Any) -> None:
        self.calls: list[str] = []
        transport = database.spanner_api._transport
        for name in self.METHODS:
            method = getattr(transport, name)
            transport._wrapped_methods[method] = self._counting(
                name, transport._wrapped_methods[method]
            )

    def _counting(self, name: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return original(*args, **kwargs)

        return call

    def take(self) -> list[str]:
        """The calls since the last take, in order."""
        calls, self.calls = self.calls, []
        return calls
