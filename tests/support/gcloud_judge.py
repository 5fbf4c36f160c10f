"""The installed gcloud as a judge of command syntax, offline, for the deploy tests.

Each command runs with a throwaway CLOUDSDK_CONFIG, credentials disabled and every request
sent to a proxy on a loopback port that refuses connections. A command the parser rejects
fails at once (``unrecognized arguments``, ``Invalid value``); one it accepts fails later, on
the connection, after gcloud's retries (~30 s). So every command of every deploy test is
planned and started in one batch, once per session (tests/conftest.py's ``gcloud_verdicts``),
and each test checks its own plan and reads the verdicts on its commands: three batches one
after the other waited those 30 s three times. See docs/platform-facts.md, "gcloud as a
syntax judge".
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

GCLOUD = shutil.which("gcloud")
ACCEPTED = "Unable to connect to proxy"  # Parsed, then failed on the connection.
# Seconds for the whole batch: each command waits ~30 s, and some 60 gcloud processes
# starting at once share 2 cores.
DEADLINE = 300


def offline_env(config_dir: Path, port: int) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(config_dir),
        "LANG": "C.UTF-8",
        "CLOUDSDK_CONFIG": str(config_dir),
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "true",
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        "CLOUDSDK_PROXY_TYPE": "http",
        "CLOUDSDK_PROXY_ADDRESS": "127.0.0.1",
        "CLOUDSDK_PROXY_PORT": str(port),
    }


class GcloudBatch:
    """Commands started at once; the verdict on each is read when a test asks for it."""

    def __init__(self, planned: dict[str, list[list[str]]], env: dict[str, str]) -> None:
        assert GCLOUD is not None
        self.planned = planned  # The commands of each test, by the test module's name.
        self.started = time.monotonic()
        self._running: dict[str, subprocess.Popen[str]] = {}
        self._outputs: dict[str, str] = {}
        for args in (args for commands in planned.values() for args in commands):
            command = shlex.join(["gcloud", *args])
            if command not in self._running:
                self._running[command] = subprocess.Popen(
                    [GCLOUD, *args],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )

    def rejected(self, commands: list[list[str]]) -> dict[str, str]:
        """The output of each of ``commands`` gcloud did not accept. Every one must have
        been in the batch: a command judged alone would not have been judged at all."""
        ends = self.started + DEADLINE
        rejected = {}
        for args in commands:
            command = shlex.join(["gcloud", *args])
            assert command in self._running, f"not in the session's gcloud batch: {command}"
            if command not in self._outputs:
                process = self._running[command]
                try:
                    output, _ = process.communicate(timeout=max(1, ends - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    output = f"(no verdict within {DEADLINE} s)\n" + process.communicate()[0]
                self._outputs[command] = output
            if ACCEPTED not in self._outputs[command]:
                rejected[command] = self._outputs[command].strip()[:600]
        return rejected

    def assert_rejects_only_bad(
        self, commands: list[list[str]], bad: list[list[str]], what: str = "planned"
    ) -> None:
        """gcloud rejected every one of ``bad`` (else the judge proves nothing) and none of
        ``commands`` (the message names ``what`` commands they are)."""
        rejected = self.rejected(commands + bad)
        for args in bad:
            assert shlex.join(["gcloud", *args]) in rejected, f"the judge accepted {args}"
            del rejected[shlex.join(["gcloud", *args])]
        assert rejected == {}, f"gcloud rejected {what} commands:\n" + "\n\n".join(
            f"{command}\n  -> {output}" for command, output in rejected.items()
        )

    def close(self) -> None:
        """Stop what still runs, and close every pipe: a command whose verdict no test of
        this process asked for (under pytest-xdist, another worker's) still holds one."""
        for process in self._running.values():
            if process.poll() is None:
                process.kill()
            if process.stdout is not None and not process.stdout.closed:
                process.communicate()
