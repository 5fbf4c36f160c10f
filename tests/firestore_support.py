"""Where the Firestore tests run: the npm Firestore emulator (started here), or a real
project when ``TASKLEASE_FIRESTORE_LIVE=1``.

In CI (``CI=true``) a missing emulator fails the tests instead of skipping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from worker.serve import free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "services" / "firestore_emulator.js"
PACKAGE = ROOT / "node_modules" / "@firestore-emulator" / "server"
LIVE = os.environ.get("TASKLEASE_FIRESTORE_LIVE") == "1"
PROJECT = os.environ.get("GOOGLE_CLOUD_PROJECT", "tasklease-test") if LIVE else "tasklease-test"

# The npm emulator's documented gaps (platform-facts.md): tests whose property it cannot give.
IGNORES_UPDATE_TIME = pytest.mark.firestore_emulator_gap(
    "@firestore-emulator/server ignores last_update_time preconditions, so a stale attempt's "
    "conditional write is not refused"
)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"Firestore emulator unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"Firestore emulator unavailable ({reason}); `make test` installs it with npm")


def start_emulator() -> Iterator[str]:
    """Run the emulator on a free loopback port; yield its host:port (skip or fail if absent)."""
    node = shutil.which("node")
    if node is None:
        _unavailable("no node on PATH")
    if not PACKAGE.exists():
        _unavailable(f"{PACKAGE.relative_to(ROOT)} missing (run npm ci)")
    try:
        with run_emulator() as host:
            yield host
    except EmulatorDidNotStart as exc:
        _unavailable(str(exc))


class EmulatorDidNotStart(RuntimeError):
    pass


@contextmanager
def run_emulator() -> Iterator[str]:
    """``node tests/services/firestore_emulator.js`` on a free loopback port: its host:port."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "firestore-emulator.log"
        with log.open("wb") as output:  # The child keeps its own descriptor.
            process = subprocess.Popen(
                ["node", str(SCRIPT), str(port)], cwd=ROOT, stdout=output, stderr=subprocess.STDOUT
            )
        try:
            deadline = time.monotonic() + 30
            while "listening" not in log.read_text():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise EmulatorDidNotStart(f"it did not start: {log.read_text().strip()[-500:]}")
                time.sleep(0.05)
            yield f"127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=10)


class RpcCounter:
    """Counts the RPCs a Firestore client makes, by wrapping its GAPIC transport's methods."""

    METHODS = ("commit", "batch_get_documents", "begin_transaction", "rollback", "run_query")

    def __init__(self, client: Any) -> None:
        self.calls: list[str] = []
        transport = client._firestore_api._transport
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


def unique_collection() -> str:
    return f"runs_{uuid.uuid4().hex[:12]}"
