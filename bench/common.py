"""Shared pieces of the benchmarks: child processes on 127.0.0.1, a counting target, a local
OIDC token issuer."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import requests

if TYPE_CHECKING:
    from tasklease.emulator.oidc import TokenIssuer

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / ".tasklease" / "bench"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on 127.0.0.1:{port} within {timeout} s")


@contextmanager
def child(
    command: Sequence[str], port: int, log: Path, env: dict[str, str] | None = None
) -> Iterator[None]:
    """Run ``command`` until the block ends; it must listen on ``port``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as output:
        process = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=ROOT,
        )
    try:
        wait_for_port(port)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@contextmanager
def tasklease_emulator(name: str) -> Iterator[str]:
    """``tasklease emulator`` in its own process, with a fresh data folder: its endpoint."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "tasklease.cli",
        "emulator",
        "--port",
        str(port),
        "--data-dir",
        str(BENCH_DIR / f"{name}-{port}"),
    ]
    with child(command, port, BENCH_DIR / f"{name}-emulator.log"):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def counting_target() -> Iterator[str]:
    """A trivial HTTP target in its own process: POST anywhere answers 200; GET /count."""
    port = free_port()
    with child(
        [sys.executable, str(Path(__file__).with_name("target.py")), str(port)],
        port,
        BENCH_DIR / "target.log",
    ):
        yield f"http://127.0.0.1:{port}"


def received(target: str) -> int:
    return int(requests.get(f"{target}/count", timeout=5).text)


def wait_until_received(target: str, count: int, timeout: float = 600.0) -> float:
    """Block until the target got ``count`` requests; return the monotonic time it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if received(target) >= count:
            return time.monotonic()
        time.sleep(0.01)
    raise TimeoutError(f"target got {received(target)} of {count} requests in {timeout} s")


@contextmanager
def oidc_certs(issuer: TokenIssuer) -> Iterator[str]:
    """Serve ``issuer``'s public keys in Google's format, cacheable for an hour as Google's
    are, from a thread on 127.0.0.1 until the block ends: their URL."""
    body = json.dumps(issuer.certs()).encode()

    class Certs(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "public, max-age=3600")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # Quiet: no line per fetch.
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Certs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/certs"
    finally:
        server.shutdown()
        server.server_close()
