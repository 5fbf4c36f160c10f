"""Finding: the blocking sender (TLS and DNS-named targets, RunTask) read a target's whole
answer body into memory with ``response.read()``, though nothing of the body is recorded: one
400 MB answer cost 400 MB. It now reads the body in small pieces and keeps none of it, and
stops reading (closing the connection) past a bound."""

from __future__ import annotations

import socket
import threading
import tracemalloc
from collections.abc import Iterator

import pytest

from tasklease.emulator.faults import Faults
from tasklease.emulator.sender import Sender

BODY_BYTES = 64 * 1024 * 1024


@pytest.fixture
def huge_answer() -> Iterator[str]:
    """A target that answers 200 with a 64 MB body."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {BODY_BYTES}\r\n\r\n".encode()
            piece = b"x" * 65536
            try:
                connection.sendall(head)
                for _ in range(BODY_BYTES // len(piece)):
                    connection.sendall(piece)
            except OSError:  # The sender stopped reading and closed: expected.
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}/big"
    listener.close()
    thread.join(timeout=10)


def test_the_blocking_sender_does_not_hold_a_huge_answer_in_memory(huge_answer: str) -> None:
    sender = Sender(Faults())
    tracemalloc.start()
    try:
        result, _ = sender.send("POST", huge_answer, {}, b"{}", 30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        sender.close()
    assert result.status == 200
    assert peak < 8 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB while reading the answer"
