"""The sender's connections: kept alive between attempts, never reused once the target closed
them, and bounded by the attempt's deadline."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tasklease.emulator.faults import Faults
from tasklease.emulator.sender import Sender

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@contextmanager
def raw_target(
    serve: Callable[[socket.socket, list[int]], None],
) -> Iterator[tuple[str, list[int]]]:
    """A target on a bare socket: ``serve(connection, accepted)`` runs per connection in its
    own thread; ``accepted`` counts connections."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            threading.Thread(target=serve, args=(connection, accepted), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/t", accepted
    finally:
        listener.close()


def read_request(connection: socket.socket) -> bool:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return False
        data += chunk
    return True


def answer_forever(connection: socket.socket, _: list[int]) -> None:
    with connection:
        while read_request(connection):
            connection.sendall(OK)


def answer_once_then_close(connection: socket.socket, _: list[int]) -> None:
    """Answers without saying it will close, then closes: a keep-alive timeout, say."""
    with connection:
        if read_request(connection):
            connection.sendall(OK)
            time.sleep(0.05)


def never_answer(connection: socket.socket, _: list[int]) -> None:
    with connection:
        read_request(connection)
        time.sleep(3)


def test_attempts_share_one_kept_alive_connection() -> None:
    sender = Sender(Faults())
    with raw_target(answer_forever) as (url, accepted):
        results = [sender.send("POST", url, {}, b"{}", 5)[0] for _ in range(5)]
    sender.close()
    assert [result.status for result in results] == [200] * 5
    assert len(accepted) == 1


def test_a_connection_the_target_closed_is_not_reused() -> None:
    sender = Sender(Faults())
    with raw_target(answer_once_then_close) as (url, accepted):
        first = sender.send("POST", url, {}, b"{}", 5)[0]
        time.sleep(0.2)  # The target has closed its end by now.
        second = sender.send("POST", url, {}, b"{}", 5)[0]
    sender.close()
    assert (first.status, second.status, second.error) == (200, 200, None)
    assert len(accepted) == 2


def test_no_answer_within_the_deadline() -> None:
    sender = Sender(Faults())
    with raw_target(never_answer) as (url, _):
        started = time.monotonic()
        result = sender.send("POST", url, {}, b"{}", 0.5)[0]
    sender.close()
    assert (result.status, result.error) == (None, "no answer within the deadline")
    assert 0.4 < time.monotonic() - started < 2


def test_a_refused_connection_is_a_failed_attempt() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = Sender(Faults()).send("POST", f"http://127.0.0.1:{port}/", {}, b"", 5)[0]
    assert result.status is None
    assert result.error is not None and "refused" in result.error.lower()
