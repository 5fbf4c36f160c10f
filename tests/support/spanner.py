"""Where the Spanner tests run: Google's Cloud Spanner emulator (gcloud's native
``cloud-spanner-emulator`` component), started once per test session on free loopback ports.

Clients find it through ``SPANNER_EMULATOR_HOST``; the instance is created through the client
(config ``emulator-config``), and each test gets a database of its own, dropped after it. In
CI (``CI=true``) a missing emulator fails the tests instead of skipping them.
"""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tasklease.plumbing.serve import free_port
from tests.support import gcloud_emulators
from tests.support.process_groups import group_states

PROJECT = "tasklease-test"
INSTANCE = "tasklease"
IN_CI = os.environ.get("CI") == "true"
EmulatorDidNotStart = gcloud_emulators.EmulatorDidNotStart  # Caught by the fault suite.


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
    """``gcloud emulators spanner start`` on free loopback ports (gRPC and REST), its
    instance created."""
    port, rest_port = free_port(), free_port()
    flags = [f"--host-port=127.0.0.1:{port}", f"--rest-port={rest_port}"]

    def ready(log: Path) -> bool:
        return "gRPC server listening" in log.read_text() and _accepts(port)

    with gcloud_emulators.run_gcloud_emulator("spanner", flags, project, ready) as process:
        host = f"127.0.0.1:{port}"
        create_instance(host, project)
        yield Emulator(host, process.pid)


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


class RpcCounter(gcloud_emulators.RpcCounter):
    """Counts the RPCs a Spanner database's client makes (a retry of an RPC after
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
        super().__init__(database.spanner_api._transport)
