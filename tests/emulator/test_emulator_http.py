"""The emulator's HTTP server: connections kept alive, quiet under load, stopped cleanly."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

from tasklease.emulator import CloudTasksEmulator

QUEUE = "projects/p/locations/us-central1/queues/q"


def _connection(emulator: CloudTasksEmulator) -> http.client.HTTPConnection:
    parts = urlsplit(emulator.url)
    return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)


def test_one_connection_serves_many_calls(emulator: CloudTasksEmulator) -> None:
    emulator.create_queue(QUEUE)
    connection = _connection(emulator)
    local_ports = set()
    for _ in range(3):
        connection.request("GET", f"/v2/{QUEUE}")
        response = connection.getresponse()
        assert (response.status, json.loads(response.read())["name"]) == (200, QUEUE)
        assert response.getheader("Connection") != "close"
        assert connection.sock is not None
        local_ports.add(connection.sock.getsockname()[1])
    assert len(local_ports) == 1
    connection.close()


def test_busy_request_threads_log_nothing(
    emulator: CloudTasksEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    emulator.create_queue(QUEUE)

    def get(_: int) -> int:
        connection = _connection(emulator)
        try:
            connection.request("GET", f"/v2/{QUEUE}")
            return connection.getresponse().status
        finally:
            connection.close()

    with caplog.at_level(logging.DEBUG), ThreadPoolExecutor(32) as pool:
        assert set(pool.map(get, range(200))) == {200}
    assert [r.getMessage() for r in caplog.records if r.name.startswith("waitress")] == []


def test_stop_closes_idle_kept_alive_connections_and_frees_the_port() -> None:
    emulator = CloudTasksEmulator().start()
    connection = _connection(emulator)
    connection.request("GET", "/healthz")
    assert connection.getresponse().read()
    port = int(urlsplit(emulator.url).port or 0)
    started = time.monotonic()
    emulator.stop()
    assert time.monotonic() - started < 3
    assert connection.sock is not None
    connection.sock.settimeout(5)
    try:
        assert connection.sock.recv(1) == b""  # Closed by the emulator, not left hanging.
    finally:
        connection.close()
    with socket.socket() as probe:  # The port can be bound again at once.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
