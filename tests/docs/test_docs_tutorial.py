"""The tutorial (docs/tutorial.md), executed: every code block, in order, in a fresh directory.

A block titled with a path (```` ```python title="myapp/tasks.py" ````) is written to that
file; a ```` ```console ```` block's ``$`` lines are run by bash, one real process each, in one
shell session (each command starts from the environment the last one left, as in a terminal).
The lines after a command are what the tutorial shows it printing: every word of them must be
in the real output (numbers, ids and times differ from run to run). A block titled
"Terminal 1" keeps running while the next blocks run, then gets Ctrl-C (SIGINT).

Two things differ from a reader's machine, and only these: the default ports 8080, 8123 and
8090 (``tasklease dev``'s) become free ones, so the test runs beside anything else; and
``pip install tasklease`` finds tasklease as a wheel of this checkout (the package under test)
through ``PIP_FIND_LINKS``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.checkout import clean_copy

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
FENCE = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', re.MULTILINE | re.DOTALL)
LONG_RUNNING = "Terminal 1"

pytestmark = pytest.mark.slow


@dataclass
class Command:
    line: str
    shown: str = ""  # What the tutorial shows it printing.


@dataclass
class Block:
    language: str
    title: str | None
    text: str
    commands: list[Command] = field(default_factory=list)


def blocks() -> list[Block]:
    """The tutorial's fenced blocks, console ones split into commands and their output."""
    found = []
    for language, title, text in FENCE.findall(TUTORIAL.read_text()):
        block = Block(language, title or None, text)
        if language == "console":
            lines = iter(text.splitlines())
            for line in lines:
                if line.startswith("$ "):
                    command = Command(line[2:])
                    heredoc = re.search(r"<<'(\w+)'$", command.line)
                    if heredoc:  # The document's lines belong to the command.
                        for body in lines:
                            command.line += "\n" + body
                            if body == heredoc[1]:
                                break
                    block.commands.append(command)
                else:
                    assert block.commands, f"output before any command: {line!r}"
                    block.commands[-1].shown += line + "\n"
        found.append(block)
    return found


def free_port(taken: set[int], pair: bool = False) -> int:
    """A free loopback port (and the next one free too when ``pair``: REST + gRPC)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        candidates = [port, port + 1] if pair else [port]
        if taken.isdisjoint(candidates) and all(_bindable(p) for p in candidates):
            taken.update(candidates)
            return port


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z_]{3,}", text)


def missing(shown: str, output: str) -> list[str]:
    return [word for word in words(shown) if word not in output]


class Session:
    """One terminal: each command a bash process starting from the last one's environment."""

    def __init__(self, cwd: Path, env: dict[str, str], ports: dict[str, str]) -> None:
        self.cwd, self.env, self.ports = cwd, env, ports
        self.env_file = cwd.parent / "session.env"

    def localise(self, text: str) -> str:
        for default, port in self.ports.items():
            text = re.sub(rf"\b{default}\b", port, text)
        return text

    def script(self, command: str) -> str:
        return f"set -e\n{self.localise(command)}\nenv -0 > {self.env_file}\n"

    def run(self, command: Command, timeout: float = 300) -> str:
        deadline = time.monotonic() + 30
        while True:
            done = subprocess.run(
                ["bash", "-c", self.script(command.line)],
                cwd=self.cwd,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            output = done.stdout + done.stderr
            assert done.returncode == 0, f"$ {command.line}\n{output}"
            absent = missing(command.shown, output)
            if not absent:
                break
            # What a command shows may lag a delivery (`runs list` right after an enqueue).
            assert time.monotonic() < deadline, f"$ {command.line}\nlacks {absent}:\n{output}"
            time.sleep(0.5)
        entries = self.env_file.read_bytes().split(b"\0")
        self.env = dict(e.decode().split("=", 1) for e in entries if b"=" in e)
        return output

    def start(self, command: Command, extra: str) -> subprocess.Popen[str]:
        log = self.cwd.parent / "terminal-1.log"
        with log.open("w") as out:  # The child keeps its own descriptor.
            process = subprocess.Popen(
                ["bash", "-c", f"exec {self.localise(command.line)} {extra}"],
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        deadline = time.monotonic() + 90
        while absent := missing(command.shown, log.read_text()):
            assert process.poll() is None, f"$ {command.line} exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, (
                f"no {absent} from {command.line}:\n{log.read_text()}"
            )
            time.sleep(0.3)
        return process


def stop(process: subprocess.Popen[str]) -> int:
    """Ctrl-C, as a terminal sends it: SIGINT to the foreground process group."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise


def session_environment(tmp: Path) -> dict[str, str]:
    """A reader's shell: no virtual environment active, ``python`` the interpreter under test,
    and pip finding tasklease as a wheel of this checkout."""
    wheels = tmp / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", wheels, "."],
        cwd=clean_copy(tmp / "checkout"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    configured = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    python_bin = tmp / "bin"
    python_bin.mkdir()
    (python_bin / "python").symlink_to(sys.executable)
    outer_bin = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != outer_bin]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PYTEST", "TASKLEASE_", "PIP_"))
    }
    env.update(
        PATH=os.pathsep.join([str(python_bin), *path]),
        PIP_FIND_LINKS=" ".join(filter(None, [str(wheels), configured])),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    return env


def test_every_block_of_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    tutorial = blocks()
    assert any(b.title == LONG_RUNNING for b in tutorial)
    project = tmp_path / "project"
    project.mkdir()
    taken: set[int] = set()
    worker, emulator, dashboard = free_port(taken), free_port(taken, pair=True), free_port(taken)
    ports = {"8080": str(worker), "8123": str(emulator), "8090": str(dashboard)}
    session = Session(project, session_environment(tmp_path), ports)
    background: list[subprocess.Popen[str]] = []
    try:
        for block in tutorial:
            if block.language != "console":
                assert block.title, f"an untitled {block.language} block: {block.text[:60]!r}"
                target = project / block.title
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.text)
            elif block.title == LONG_RUNNING:
                (command,) = block.commands
                assert command.line.startswith("tasklease dev ")
                flags = f"--worker-port {worker} --port {emulator} --dashboard-port {dashboard}"
                background.append(session.start(command, flags))
            else:
                for command in block.commands:
                    session.run(command)
        for process in background:
            assert stop(process) in (0, -signal.SIGINT, 128 + signal.SIGINT)
    finally:
        for process in background:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
