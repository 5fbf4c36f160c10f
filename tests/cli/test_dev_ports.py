"""A `tasklease dev` whose port is taken: one line naming the port and its flag, exit 1,
and no process of it left running."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.dev_stack import dev_flags, start_dev, wait_gone


@pytest.mark.parametrize(
    ("flag", "what"),
    [
        ("--worker-port", "the worker"),
        ("--port", "the emulator's REST API"),
        ("--grpc-port", "the emulator's gRPC API"),
        ("--dashboard-port", "the dashboard"),
    ],
)
def test_a_taken_port_is_one_line_naming_it_and_its_flag_and_nothing_stays_running(
    flag: str, what: str, tmp_path: Path
) -> None:
    flags = dev_flags()
    port = int(flags[flags.index(flag) + 1])
    with socket.socket() as holder:  # Another program (another stack) listens there.
        holder.bind(("127.0.0.1", port))
        holder.listen()
        process, marker = start_dev(tmp_path, ["tasklease.demo.shop:router", *flags])
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 1
    assert output.splitlines() == [
        f"tasklease dev: port {port} ({what}) is already in use, perhaps by another "
        f"tasklease dev: choose another with {flag} PORT"
    ]
    assert wait_gone(marker) == []


@pytest.mark.parametrize(("command", "flag"), [("emulator", "--port"), ("dashboard", "--port")])
def test_the_emulator_and_dashboard_alone_name_a_taken_port_and_its_flag(
    command: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tasklease import cli  # noqa: PLC0415

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert cli.main([command, flag, str(port)]) == 1
    assert f"port {port} " in capsys.readouterr().err
