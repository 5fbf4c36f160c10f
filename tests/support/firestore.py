"""Where the Firestore tests run: Google's official Firestore emulator (gcloud), the npm
emulator as a local fallback, or a real project when ``TASKLEASE_FIRESTORE_LIVE=1``.

FirestoreStore's safety rests on ``last_update_time`` preconditions and transaction
isolation; Google's emulator enforces both, ``@firestore-emulator/server`` neither
(docs/platform-facts.md). So the npm emulator is only a local fallback: the tests marked
``firestore_emulator_gap`` skip on it, and the run says loudly that it used it. In CI
(``CI=true``) a missing gcloud emulator fails the tests instead.
``TASKLEASE_FIRESTORE_EMULATOR=npm`` picks the fallback on purpose.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tasklease.plumbing.serve import free_port
from tests.support import gcloud_emulators
from tests.support.gcloud_emulators import EmulatorDidNotStart

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "services" / "firestore_emulator.js"
PACKAGE = ROOT / "node_modules" / "@firestore-emulator" / "server"
LIVE = os.environ.get("TASKLEASE_FIRESTORE_LIVE") == "1"
PROJECT = os.environ.get("GOOGLE_CLOUD_PROJECT", "tasklease-test") if LIVE else "tasklease-test"
IN_CI = os.environ.get("CI") == "true"

GCLOUD = "gcloud"
NPM = "npm"


class _Session:
    """Which Firestore this test session uses: GCLOUD, NPM, "live", or None before it started,
    and why the npm fallback is in use (for the loud summary at the end of the run)."""

    backend: str | None = "live" if LIVE else None
    fallback_reason: str | None = None


session = _Session()

# The npm emulator's documented gaps (docs/platform-facts.md): tests whose property it cannot give.
IGNORES_UPDATE_TIME = pytest.mark.firestore_emulator_gap(
    "@firestore-emulator/server ignores last_update_time preconditions, so a stale attempt's "
    "conditional write is not refused"
)


def start_emulator() -> Iterator[str]:
    """Run an emulator on a free loopback port for the session; yield its host:port.

    Google's emulator first; without it, fail in CI, else fall back to the npm emulator (its
    gap tests skip and the end of the run says so), or skip if that is missing too.
    """
    wanted = os.environ.get("TASKLEASE_FIRESTORE_EMULATOR", GCLOUD)
    reason = "TASKLEASE_FIRESTORE_EMULATOR=npm" if wanted == NPM else None
    if reason is None:
        try:
            with run_gcloud_emulator() as host:
                session.backend = GCLOUD
                yield host
                return
        except EmulatorDidNotStart as exc:
            reason = str(exc)
    if IN_CI:
        pytest.fail(
            f"Google's Firestore emulator is required in CI and is not in use: {reason}. "
            "Install google-cloud-cli-firestore-emulator and Java 17+.",
            pytrace=False,
        )
    session.fallback_reason = reason
    if shutil.which("node") is None:
        _unavailable("no node on PATH")
    if not PACKAGE.exists():
        _unavailable(f"{PACKAGE.relative_to(ROOT)} missing (run npm ci)")
    try:
        with run_npm_emulator() as host:
            session.backend = NPM
            yield host
    except EmulatorDidNotStart as exc:
        _unavailable(str(exc))


def _unavailable(reason: str) -> None:
    pytest.skip(
        f"no Firestore emulator ({reason}): install gcloud's google-cloud-cli-firestore-emulator "
        "(or, as a fallback, `npm ci`)"
    )


@contextmanager
def run_gcloud_emulator(project: str = PROJECT) -> Iterator[str]:
    """``gcloud emulators firestore start`` on a free loopback port: its host:port (gcloud
    starts bash, which starts java)."""
    if shutil.which("java") is None:
        raise EmulatorDidNotStart("no java on PATH")
    port = free_port()
    flags = [f"--host-port=127.0.0.1:{port}", f"--project={project}"]
    with gcloud_emulators.run_gcloud_emulator(
        "firestore", flags, project, lambda _log: _answers_ok(f"http://127.0.0.1:{port}/")
    ):
        yield f"127.0.0.1:{port}"


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.read().strip() == b"Ok")
    except OSError:
        return False


@contextmanager
def run_npm_emulator() -> Iterator[str]:
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


class RpcCounter(gcloud_emulators.RpcCounter):
    """Counts the RPCs a Firestore client makes."""

    METHODS = ("commit", "batch_get_documents", "begin_transaction", "rollback", "run_query")

    def __init__(self, client: Any) -> None:
        super().__init__(client._firestore_api._transport)


def unique_collection() -> str:
    return f"runs_{uuid.uuid4().hex[:12]}"
