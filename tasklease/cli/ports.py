"""Ports a command is about to listen on, checked before anything starts: a clash is one
line naming the port and the flag that changes it, and nothing is left running."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Port:
    host: str
    port: int
    what: str  # "the worker", "the emulator's REST API"...
    flag: str  # The flag that changes it, e.g. "--worker-port".


def in_use(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` (so binding it would fail). SO_REUSEADDR,
    as the servers set it, so a port left in TIME_WAIT by a stopped stack counts as free; a
    listener (gRPC's SO_REUSEPORT one included) still refuses this socket the bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def first_clash(ports: Iterable[Port]) -> str | None:
    """The line to print for the first port that is taken, or None when all are free."""
    for wanted in ports:
        if wanted.port and in_use(wanted.host, wanted.port):
            return (
                f"port {wanted.port} ({wanted.what}) is already in use, perhaps by another "
                f"tasklease dev: choose another with {wanted.flag} PORT"
            )
    return None
