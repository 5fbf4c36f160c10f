"""Shared pieces of the benchmarks: child processes on 127.0.0.1, a counting target."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import requests

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
