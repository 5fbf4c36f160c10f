"""The gcloud adapter: every call the deploy kit makes to Google Cloud goes through it."""

from __future__ import annotations

import json
import shlex
import subprocess
from typing import Any

from tasklease.deploy.errors import DeployError

NOT_FOUND_MARKERS = ("not_found", "not found", "does not exist", "404")


class Gcloud:
    """Runs gcloud: look-ups return parsed JSON (None when absent); changes are printed and
    run. With ``dry_run``, nothing runs: look-ups find nothing and changes are only printed."""

    def __init__(self, *, dry_run: bool, executable: str = "gcloud") -> None:
        self.dry_run = dry_run
        self.executable = executable

    def read(self, *args: str) -> Any:
        command = [self.executable, *args, "--format=json"]
        if self.dry_run:
            print(f"# check: {shlex.join(command)}")
            return None
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            if any(marker in result.stderr.lower() for marker in NOT_FOUND_MARKERS):
                return None
            raise DeployError(f"{shlex.join(command)} failed:\n{result.stderr.strip()}")
        return json.loads(result.stdout or "null")

    def change(self, *args: str) -> None:
        command = [self.executable, *args]
        print(f"{'' if self.dry_run else '+ '}{shlex.join(command)}", flush=True)
        if self.dry_run:
            return
        result = subprocess.run(command, check=False)
        if result.returncode != 0:
            raise DeployError(f"{shlex.join(command)} failed with exit code {result.returncode}")

    @staticmethod
    def unchanged(what: str) -> None:
        print(f"  = {what}: up to date")


def has_binding(policy: Any, member: str, role: str) -> bool:
    """Whether an IAM policy (as gcloud's get-iam-policy gives it) grants ``role`` to ``member``."""
    return any(
        binding.get("role") == role and member in binding.get("members", [])
        for binding in (policy or {}).get("bindings", [])
    )
