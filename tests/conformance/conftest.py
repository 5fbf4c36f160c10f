"""gcloud, a client nobody here wrote, against the emulator.

Each test module gets an emulator and a throwaway ``CLOUDSDK_CONFIG`` with credentials off and
the cloudtasks, cloudscheduler and appengine endpoints pointed at the emulator (gcloud asks App
Engine for the default location when ``--location`` is missing). Without gcloud the tests
skip, loudly; in CI (``CI=true``) they fail instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tasklease.emulator import CloudTasksEmulator

PROJECT = "test-project"
LOCATION = "us-central1"


@dataclass(frozen=True)
class Gcloud:
    """Runs gcloud against one emulator; ``--format=json`` output comes back parsed."""

    env: dict[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["gcloud", *args], check=False, env=self.env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip

    def __call__(self, *args: str) -> Any:
        done = self.run(*args, "--format=json")
        assert done.returncode == 0, f"gcloud {' '.join(args)} failed:\n{done.stderr}"
        return json.loads(done.stdout) if done.stdout.strip() else None

    def fails(self, *args: str) -> str:
        """The error gcloud printed for a command that must fail."""
        done = self.run(*args)
        assert done.returncode != 0, f"gcloud {' '.join(args)} succeeded:\n{done.stdout}"
        return done.stderr


def _require_gcloud() -> None:
    if shutil.which("gcloud"):
        return
    message = (
        "gcloud is not installed: the gcloud conformance tests of the emulator did NOT run "
        "(install the Google Cloud CLI to run them)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(f"!!! {message} !!!")


@pytest.fixture(scope="module")
def conformance_emulator() -> Iterator[CloudTasksEmulator]:
    # Per module, not per session: a live emulator's queues show in the process-wide metrics.
    with CloudTasksEmulator(queue_reuse_window=60.0) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def gcloud(
    conformance_emulator: CloudTasksEmulator, tmp_path_factory: pytest.TempPathFactory
) -> Gcloud:
    _require_gcloud()
    config: Path = tmp_path_factory.mktemp("gcloud-config")
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": str(config),
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
    }
    tool = Gcloud(env)
    endpoint = conformance_emulator.url + "/"
    for key, value in [
        ("auth/disable_credentials", "true"),
        ("api_endpoint_overrides/cloudtasks", endpoint),
        ("api_endpoint_overrides/cloudscheduler", endpoint),
        ("api_endpoint_overrides/appengine", endpoint),
        ("core/project", PROJECT),
    ]:
        done = tool.run("config", "set", key, value)
        assert done.returncode == 0, done.stderr
    return tool
