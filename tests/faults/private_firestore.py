"""A Firestore emulator of the test's own (Google's, ``gcloud emulators firestore start``), so
a scenario can freeze it without disturbing the session's shared one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from tasklease.plumbing.serve import free_port

PROJECT = "tasklease-faults"


class PrivateFirestore:
    """The running emulator: its host:port, and its process group to freeze and thaw."""

    def __init__(self, host: str, process: subprocess.Popen[bytes]) -> None:
        self.host = host
        self._process = process

    def freeze(self) -> None:
        """SIGSTOP gcloud, bash and java: calls hang as on a partitioned network."""
        os.killpg(self._process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self._process.pid, signal.SIGCONT)


@contextmanager
def private_firestore() -> Iterator[PrivateFirestore]:
    """Start the emulator on a free loopback port (skip, or fail in CI, if it is missing)."""
    missing = [tool for tool in ("gcloud", "java") if shutil.which(tool) is None]
    if missing:
        message = f"Google's Firestore emulator needs {', '.join(missing)} on PATH"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "CLOUDSDK_CONFIG": str(Path(tmp) / "gcloud"),
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_CORE_PROJECT": PROJECT,
        }
        log = Path(tmp) / "emulator.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                ["gcloud", "emulators", "firestore", "start",
                 f"--host-port=127.0.0.1:{port}", f"--project={PROJECT}", "--quiet"],
                cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=output,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while not _answers_ok(f"http://127.0.0.1:{port}/"):
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"Firestore emulator did not start: {log.read_text()[-800:]}")
                time.sleep(0.2)
            yield PrivateFirestore(f"127.0.0.1:{port}", process)
        finally:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            with suppress(ProcessLookupError):  # bash and java outlive gcloud: the group.
                os.killpg(process.pid, signal.SIGKILL)


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.read().strip() == b"Ok")
    except OSError:
        return False
