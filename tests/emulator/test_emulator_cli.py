"""``tasklease emulator`` serves both transports and says where."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

PARENT = "projects/p/locations/us-central1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_tasklease_emulator_prints_and_serves_its_grpc_endpoint(tmp_path: Path) -> None:
    port, grpc_port = free_port(), free_port()
    command = [
        *(sys.executable, "-m", "tasklease.cli", "emulator"),
        *("--port", str(port), "--grpc-port", str(grpc_port)),
        *("--data-dir", str(tmp_path / "data")),
    ]
    log = tmp_path / "emulator.log"
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while f"gRPC on 127.0.0.1:{grpc_port}" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert f"REST on http://127.0.0.1:{port}" in log.read_text()
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        client = tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
        client.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=f"{PARENT}/queues/q"))
        assert [q.name for q in client.list_queues(parent=PARENT)] == [f"{PARENT}/queues/q"]
        channel.close()
    finally:
        process.terminate()
        process.wait(timeout=20)
