"""Shared by the Firestore and Spanner test supports: starting one of gcloud's emulators in
a process group of its own, stopping that group, and counting a client's RPCs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from tests.support.process_groups import group_alive


class EmulatorDidNotStart(RuntimeError):
    pass


@contextmanager
def run_gcloud_emulator(
    product: str, flags: Sequence[str], project: str, ready: Callable[[Path], bool]
) -> Iterator[subprocess.Popen[bytes]]:
    """``gcloud emulators PRODUCT start FLAGS``, yielded once ``ready(log)`` holds.

    gcloud gets a throwaway config directory and no reason to prompt or reach the network;
    it starts further processes (bash and java, or a gateway), so it runs in its own process
    group and the whole group is stopped afterwards.
    """
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise EmulatorDidNotStart("no gcloud on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "CLOUDSDK_CONFIG": str(Path(tmp) / "gcloud"),
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
            "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "1",
            "CLOUDSDK_CORE_PROJECT": project,
        }
        log = Path(tmp) / f"{product}-emulator.log"
        command = [gcloud, "emulators", product, "start", *flags, "--quiet"]
        with log.open("wb") as output:  # The child keeps its own descriptor.
            process = subprocess.Popen(
                command,
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 60
            while not ready(log):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise EmulatorDidNotStart(
                        f"gcloud's emulator did not start: {log.read_text().strip()[-800:]}"
                    )
                time.sleep(0.1)
            yield process
        finally:
            stop_group(process)


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop an emulator's whole process group, killed if it lingers (a frozen group gets
    SIGCONT first, or SIGTERM would wait)."""
    for sig in (signal.SIGCONT, signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        if sig is signal.SIGCONT:
            continue
        deadline = time.monotonic() + 10
        while group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not group_alive(process.pid):
            break
    process.wait(timeout=5)


class RpcCounter:
    """Counts the RPCs a client makes, by wrapping the ``METHODS`` of its GAPIC transport:
    one count per RPC the client library issues (a retry inside the library's retry loop
    does not count again)."""

    METHODS: tuple[str, ...] = ()

    def __init__(self, transport: Any) -> None:
        self.calls: list[str] = []
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
